# ruff: noqa
"""Session 43, helper dwrecipes: the sweep behind docs/data_weights.md "Other tasks (session 43)"
(a record of the runs, not library code; the same toys are tested in tests/test_data_weights_tasks.py).
Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/data_weights_tasks_s43/sweep2.py ARG
(see the docs section for the arguments)."""

import sys

sys.argv = [sys.argv[0], "none"] + sys.argv[1:]
exec(open(__file__.rsplit("/", 1)[0] + "/sweep.py").read().split("which = sys.argv[1]")[0])
which = sys.argv[2]
T, V, C, PAD = 10, 8, 3, -100


def seq_data(seed=0):
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        x = torch.randint(1, V, (n, T), generator=g)
        L = torch.randint(2, T + 1, (n,), generator=g)
        y = x % C
        mask = torch.arange(T)[None] < L[:, None]
        x = x.masked_fill(~mask, 0)
        y = y.masked_fill(~mask, PAD)
        return x, y

    X, Y = draw(N)
    Xv, Yv = draw(60)
    Y[:BAD] = torch.where(Y[:BAD] == PAD, Y[:BAD], (Y[:BAD] + 1) % C)
    return X, Y, Xv, Yv


class Seq(pl.LightningModule):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, 16)
        self.out = torch.nn.Linear(16, C)
        self.mode = mode

    def training_step(self, b, i):
        x, y = b
        z = self.out(torch.tanh(self.emb(x)))  # B T C
        tok = F.cross_entropy(z.transpose(1, 2), y, ignore_index=PAD, reduction="none")  # B T
        if self.mode == "BT":
            return tok
        real = y != PAD
        if self.mode == "seqmean":
            return tok.sum(1) / real.sum(1).clamp_min(1)
        return tok.sum(1) / real.sum(1).float().mean()  # token-mean preserving

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


if which == "seq":
    for mode in ("BT", "seqmean", "tokmean"):
        X, Y, Xv, Yv = seq_data()
        for obj in ("default",):
            r = run(Seq(mode), X, Y, Xv, Yv)
            report(f"seq {mode} {obj}", *r)
            L = (Y != PAD).sum(1).float()
            w = r[0]
            print(
                "  corr(w, length) clean:",
                float(torch.corrcoef(torch.stack([w[BAD:], L[BAD:]]))[0, 1]),
            )


def ml_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(4, 5, generator=g)

    def draw(n):
        x = torch.randn(n, 4, generator=g)
        return x, ((x @ A) > 0.3).float()

    X, Y = draw(N)
    Xv, Yv = draw(60)
    Y[:BAD] = 1 - Y[:BAD]
    return X, Y, Xv, Yv


class ML(pl.LightningModule):
    def __init__(self, red):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)
        )
        self.red = red

    def training_step(self, b, i):
        x, y = b
        l = F.binary_cross_entropy_with_logits(self.net(x), y, reduction="none")
        return l if self.red == "BC" else l.sum(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


if which == "ml":
    for red in ("BC", "sum"):
        X, Y, Xv, Yv = ml_data()
        r = run(ML(red), X, Y, Xv, Yv)
        report(f"multilabel {red}", *r)


# InfoNCE: two views; the first BAD examples' second view belongs to another example
def nce_data(seed=0):
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        c = torch.randn(n, 8, generator=g)
        return c + 0.3 * torch.randn(n, 8, generator=g), c + 0.3 * torch.randn(n, 8, generator=g)

    X, Y = draw(N)
    Xv, Yv = draw(60)
    Y[:BAD] = Y[:BAD].roll(1, 0)
    return X, Y, Xv, Yv


class NCE(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)
        )

    def training_step(self, b, i):
        a, p = b
        za, zp = F.normalize(self.net(a), dim=1), F.normalize(self.net(p), dim=1)
        logits = za @ zp.T / 0.2
        return F.cross_entropy(logits, torch.arange(len(a)), reduction="none")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


if which == "nce":
    X, Y, Xv, Yv = nce_data()
    r = run(NCE(), X, Y, Xv, Yv)
    report("infonce", *r)


# imbalance: class 2 tiny (12 of 240), 30% symmetric-ish noise among 0/1
def imb_data(seed=0, tiny=12):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])

    def draw(n, t):
        y = torch.cat([torch.arange(n - t) % 2, torch.full((t,), 2)])
        return centres[y] + 0.8 * torch.randn(n, 2, generator=g), y

    X, Y = draw(N, tiny)
    Xv, Yv = draw(60, 20)
    perm = torch.randperm(N, generator=g)
    X, Y = X[perm], Y[perm]
    Y[:BAD] = (Y[:BAD] + 1) % 3
    return X, Y, Xv, Yv


class Clf(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )

    def training_step(self, b, i):
        x, y = b
        return F.cross_entropy(self.net(x), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


if which == "imb":
    X, Y, Xv, Yv = imb_data()
    r = run(Clf(), X, Y, Xv, Yv)
    report("imbalance per sample", *r)
    print(
        "  tiny-class clean weights:",
        r[0][BAD:][Y[BAD:] == 2],
        "noisy->2:",
        r[0][:BAD][Y[:BAD] == 2],
    )
    cb = LearnedDataWeights(per="class", num_classes=3, every_n_steps=2, start_step=0, seed=0)
    tl = DataLoader(
        TensorDataset(X, Y), batch_size=24, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=15).fit(
            Clf(), tl, DataLoader(TensorDataset(Xv, Yv), batch_size=60)
        )
        fl = cb.flagged()
    print(
        "per class:",
        cb.data_weights(),
        fl,
        sorted({str(x.message)[:150] for x in ws if "LearnedDataWeights" in str(x.message)}),
    )
