"""Network structures nobody tried yet under the drop-ins (session 56): parametrized weights
(``weight_norm``, ``spectral_norm``, ``orthogonal``), a block used twice, LoRA adapters on a frozen
base, depthwise-separable convolutions with GroupNorm, a pre-norm Transformer encoder under AdamW
(decoupled), raw weights in an ``nn.ParameterDict``, an ``nn.Embedding(padding_idx=0)``, a
bidirectional LSTM over packed sequences, an output layer tied to the embedding, a layer never
called, the older hook-based ``weight_norm`` / ``spectral_norm``, and the data weights on a
per-token (B, T) loss, a sequence classifier (B,) and a multi-label loss (B, 12).

Each structure is a small ``LightningModule`` on scikit-learn's digits (1000 training / 300
validation / 497 test images, split by seed; rows of the 8×8 image as 8 tokens, or its pixel
values 0–16 as 64 tokens, where the structure reads sequences), trained for seconds. Arms:

* ``oracle``: the drop-in with its hyper steps switched off (``start_step`` beyond the fit,
  ``max_overhead=None``) against the user's own optimizer with ``weight_decay=λ₀`` (AdamW's for
  the decoupled recipe): the largest difference of any trained tensor at the fit's end (both
  fits seeded alike; ~1e-6 means the decay acts on the tensors the optimizer would decay, once);
* ``own``: the user's recipe, its optimizer's fixed ``weight_decay=λ₀``;
* ``learned``: ``LearnedWeightDecay(λ₀)`` (defaults; ``decoupled=True`` for AdamW), the optimizer's
  decay removed;
* ``implicit``: the same with ``invariant="implicit"`` (no scale-invariant group held).

The data-weights recipes run ``LearnedDataWeights()`` against the plain fit (recorded as ``own``).

Held-out test cross entropy (learned − own, paired by seed). Run::

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 5 python benchmarks/bench_zoo_s56.py
    ... --structures spectral_norm_mlp dwsep_groupnorm --arms own learned implicit \
        --seeds 0 1 2 3 4 5
    python benchmarks/bench_zoo_s56.py --table
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from recipe_harness import (
    merge_records,
    paired,
    read_records,
    recipe_key,
    timed_fit,
    trainer,
    write_json,
)
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay

OUT = Path(__file__).parent / "results" / "user_recipes" / "s56_zoo.json"
EPOCHS = 8
BATCH = 32


def digits(seed: int):
    """(train, val, test) TensorDatasets of pixels in [0, 1] (1000 / 300 / 497), by ``seed``."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    p = torch.randperm(len(y), generator=torch.Generator().manual_seed(100 + seed))
    cut = (p[:1000], p[1000:1300], p[1300:])
    return [TensorDataset(x[i], y[i]) for i in cut]


# ----------------------------------------------------------------------------- the structures


class MLP(nn.Module):
    """64 → 64 → 64 → 10, ReLU; ``wrap`` parametrizes the two hidden Linears."""

    def __init__(self, wrap=None) -> None:
        super().__init__()
        self.l1, self.l2, self.out = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        if wrap is not None:
            self.l1, self.l2 = wrap(self.l1), wrap(self.l2)

    def forward(self, x):
        return self.out(F.relu(self.l2(F.relu(self.l1(x)))))


class SharedBlock(nn.Module):
    """One residual block applied twice (its tensors trained by both uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.inp(x))
        for _ in range(2):
            h = h + F.relu(self.block(h))
        return self.out(h)


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update B A (B starts at 0)."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.A.T @ self.B.T


class LoRAMLP(nn.Module):
    """A frozen random 'backbone' (64 → 128 → 128) with LoRA adapters, a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = LoRALinear(nn.Linear(64, 128)), LoRALinear(nn.Linear(128, 128))
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(F.relu(self.l2(F.relu(self.l1(x)))))


class DWSeparable(nn.Module):
    """Conv 1→16, then depthwise 3×3 (groups=16) + pointwise 1×1, each with GroupNorm(4)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.GroupNorm(4, 16), nn.SiLU(),
            nn.Conv2d(16, 32, 1), nn.GroupNorm(4, 32), nn.SiLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


class PreNormTransformer(nn.Module):
    """The image's 8 rows as tokens: Linear(8, 32) + a learned position, one
    ``TransformerEncoderLayer(norm_first=True)`` (MultiheadAttention, 4 heads), mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.pos = nn.Parameter(torch.zeros(1, 8, 32))
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                              norm_first=True)  # fmt: skip
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.enc(self.embed(x.view(-1, 8, 8)) + self.pos)
        return self.head(h.mean(1))


class ParamDictMLP(nn.Module):
    """An MLP written with raw tensors in an ``nn.ParameterDict`` (no Linear modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.ParameterDict({
            "w1": nn.Parameter(torch.randn(64, 64) / 8), "b1": nn.Parameter(torch.zeros(64)),
            "w2": nn.Parameter(torch.randn(10, 64) / 8), "b2": nn.Parameter(torch.zeros(10)),
        })  # fmt: skip

    def forward(self, x):
        return F.relu(x @ self.p["w1"].T + self.p["b1"]) @ self.p["w2"].T + self.p["b2"]


class PaddedEmbedding(nn.Module):
    """The 64 pixel values (0–16) as tokens, 0 the padding token: ``Embedding(17, 16,
    padding_idx=0)`` plus a position embedding, averaged over the non-padding pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(17, 16, padding_idx=0)
        self.pos = nn.Embedding(64, 16)
        self.head = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        t = (x * 16).round().long()
        mask = (t > 0).float().unsqueeze(-1)
        h = (self.tok(t) + self.pos.weight) * mask
        return self.head(h.sum(1) / mask.sum(1).clamp(min=1))


class PackedBiLSTM(nn.Module):
    """The image's rows as a sequence, cut after its last row with ink (packed sequences of
    varying length, padded to 8), a bidirectional LSTM, both final states to the head."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        seq = x.view(-1, 8, 8)
        inked = (seq.sum(-1) > 0).float() * torch.arange(1, 9, device=x.device)
        lengths = inked.max(1).values.clamp(min=1).long().cpu()
        _, (h, _) = self.lstm(pack_padded_sequence(seq, lengths, batch_first=True,
                                                   enforce_sorted=False))  # fmt: skip
        return self.head(torch.cat([h[0], h[1]], 1))


class TokenTagger(nn.Module):
    """A per-token loss (B, T): each of the 8 rows predicts the digit (a GRU over the rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 32, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.gru(x.view(-1, 8, 8))[0])  # (B, 8, 10)


def sgd(params, wd):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=wd)


def adam(params, wd):
    return torch.optim.Adam(params, lr=2e-3, weight_decay=wd)


def adamw(params, wd):
    return torch.optim.AdamW(params, lr=2e-3, weight_decay=wd)


#: name → (network, optimizer, λ₀, decoupled, other LearnedWeightDecay settings)
STRUCTURES: dict[str, tuple[Any, Any, float, bool] | tuple[Any, Any, float, bool, dict]] = {
    "weight_norm_mlp": (lambda: MLP(P.weight_norm), sgd, 1e-3, False),
    "weight_norm_mlp_per_tensor": (
        lambda: MLP(P.weight_norm),
        sgd,
        1e-3,
        False,
        {"granularity": "per_tensor"},
    ),
    "spectral_norm_mlp": (lambda: MLP(P.spectral_norm), sgd, 1e-3, False),
    "orthogonal_mlp": (lambda: MLP(P.orthogonal), adam, 1e-4, False),
    # the older hook-based forms: torch.nn.utils.weight_norm / spectral_norm (weight_g, weight_v;
    # weight_orig with the weight_u, weight_v buffers), still in torch and in older code
    "weight_norm_legacy_mlp": (lambda: MLP(nn.utils.weight_norm), sgd, 1e-3, False),
    "spectral_norm_legacy_mlp": (lambda: MLP(nn.utils.spectral_norm), sgd, 1e-3, False),
    "shared_block": (SharedBlock, sgd, 1e-3, False),
    "lora_frozen_base": (LoRAMLP, adam, 1e-4, False),
    "dwsep_groupnorm": (DWSeparable, adam, 1e-4, False),
    "prenorm_transformer_adamw": (PreNormTransformer, adamw, 1e-2, True),
    "parameterdict_mlp": (ParamDictMLP, sgd, 1e-3, False),
    "embedding_padding_idx": (PaddedEmbedding, adam, 1e-4, False),
    "packed_bilstm": (PackedBiLSTM, adam, 1e-4, False),
}


class Zoo(pl.LightningModule):
    """A structure, its optimizer at weight decay ``wd``; ``per_sample``: losses per sample."""

    def __init__(self, net: nn.Module, opt, wd: float, per_sample: bool = False) -> None:
        super().__init__()
        self.net, self.opt, self.wd, self.per_sample = net, opt, wd, per_sample

    def forward(self, x):
        return self.net(x)

    def loss(self, batch):
        x, y = batch
        out = self(x)
        if out.dim() == 3:  # per token: (B, T)
            return F.cross_entropy(out.transpose(1, 2), y[:, None].expand(-1, out.shape[1]),
                                   reduction="none")  # fmt: skip
        if out.shape[1] == 12:  # multi-label: (B, 12)
            labels = torch.cat([F.one_hot(y, 10), (y % 2)[:, None], (y >= 5)[:, None]], 1)
            return F.binary_cross_entropy_with_logits(out, labels.float(), reduction="none")
        return F.cross_entropy(out, y, reduction="none")

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch).mean())

    def configure_optimizers(self):
        return self.opt([p for p in self.parameters() if p.requires_grad], self.wd)


def test_loss(module: Zoo, data: TensorDataset) -> float:
    module.eval()
    with torch.no_grad():
        return float(module.loss(data.tensors).mean())


def fit(name: str, seed: int, arm: str, data) -> dict[str, Any]:
    make, opt, lam0, decoupled, *more = STRUCTURES[name]
    kw = {"decoupled": decoupled, **(more[0] if more else {})}
    train, val, test = data
    pl.seed_everything(seed, verbose=False)
    net = make()
    # the oracle's own decay is the λ the drop-in applies: λ₀ through float32 log and exp
    applied = float(torch.tensor(math.log(lam0)).exp())
    wd = {"own": lam0, "oracle_own": applied}.get(arm, 0.0)
    module = Zoo(net, opt, wd)
    callbacks: list[Any] = []
    if arm == "learned":
        callbacks = [LearnedWeightDecay(lam0, **kw)]
    elif arm == "implicit":  # no invariant group held (what the probe's miss amounted to)
        callbacks = [LearnedWeightDecay(lam0, invariant="implicit", **kw)]
    elif arm == "oracle_dropin":
        callbacks = [LearnedWeightDecay(lam0, start_step=10**9, max_overhead=None, **kw)]
    loader = DataLoader(train, BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed))
    rec: dict[str, Any] = {"recipe": name, "arm": arm, "seed": seed}
    tr = trainer(callbacks, EPOCHS)
    timed_fit(rec, lambda: tr.fit(module, loader, DataLoader(val, 256)))
    if "error" in rec:
        return rec
    rec["test_loss"] = test_loss(module, test)
    rec["state"] = {k: v.detach().clone() for k, v in module.state_dict().items()}
    if callbacks:
        cb = callbacks[0]
        decay = cb.problem.decay
        rec["decayed"] = [e.name for e in decay.entries]
        rec["slots"] = list(decay.slot_names)
        rec["hyper_steps"] = len(cb.history)
        rec["lam"] = {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()}
        rec["lam_finite"] = all(math.isfinite(v) for v in rec["lam"].values())
        rec["invariant"] = cb.invariant_groups
    return rec


def run_structure(name: str, seed: int, arms: list[str]) -> list[dict[str, Any]]:
    data = digits(seed)
    out = []
    if "oracle" in arms:
        a, b = fit(name, seed, "oracle_own", data), fit(name, seed, "oracle_dropin", data)
        rec = {"recipe": name, "arm": "oracle", "seed": seed, "decayed": b.get("decayed"),
               "error": b.get("error") or a.get("error"),
               "warnings": b.get("warnings")}  # fmt: skip
        if "state" in a and "state" in b:
            rec["max_abs_diff"] = max(
                float((a["state"][k].float() - b["state"][k].float()).abs().max())
                for k in a["state"] if a["state"][k].is_floating_point()
            )  # fmt: skip
        out.append(rec)
    for arm in ("own", "learned", "implicit"):
        if arm in arms:
            out.append(fit(name, seed, arm, data))
    for r in out:
        r.pop("state", None)
    return out


class TiedEmbedding(PaddedEmbedding):
    """:class:`PaddedEmbedding` whose output layer is the token embedding itself (tied): 10 extra
    rows are the classes' embeddings, the logits h · E[17:]ᵀ through one Linear sharing E."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(27, 16, padding_idx=0)
        self.head = nn.Linear(16, 16)
        self.out = nn.Linear(16, 27, bias=False)
        self.out.weight = self.tok.weight  # one tensor, two modules

    def forward(self, x):
        return self.out(torch.tanh(super().forward(x)))[:, 17:]


class UnusedLayer(MLP):
    """:class:`MLP` with a layer built and never called in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(64, 64)


class SequenceClassifier(TokenTagger):
    """:class:`TokenTagger`'s GRU, its last state classified: one loss per sample (B,)."""

    def forward(self, x):
        return super().forward(x)[:, -1]


class MultiLabel(MLP):
    """:class:`MLP` with 12 binary labels per image (its digit one-hot, odd, ≥ 5): per-sample
    losses (B, 12) of ``binary_cross_entropy_with_logits``."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(64, 12)


STRUCTURES["tied_embedding_output"] = (TiedEmbedding, adam, 1e-4, False)
STRUCTURES["unused_layer"] = (UnusedLayer, sgd, 1e-3, False)

#: data-weights recipes: name → network (the loss by its output's shape)
DW_RECIPES = {
    "data_weights_token_loss": TokenTagger,
    "data_weights_sequence": SequenceClassifier,
    "data_weights_multilabel": MultiLabel,
}


def dw_fit(name: str, seed: int, arm: str) -> dict[str, Any]:
    """``LearnedDataWeights`` (defaults) against the plain fit, on the recipe's own losses."""
    train, val, test = digits(seed)
    pl.seed_everything(seed, verbose=False)
    module = Zoo(DW_RECIPES[name](), adam, 0.0, per_sample=arm == "learned")
    callbacks = [LearnedDataWeights()] if arm == "learned" else []
    data = IndexedDataset(train) if callbacks else train
    loader = DataLoader(data, BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed))
    rec: dict[str, Any] = {"recipe": name, "arm": "own" if arm == "plain" else arm, "seed": seed}
    tr = trainer(callbacks, EPOCHS)
    timed_fit(rec, lambda: tr.fit(module, loader, DataLoader(val, 256)))
    if "error" not in rec:
        rec["test_loss"] = test_loss(module, test)
    if callbacks and "error" not in rec:
        w = callbacks[0].data_weights().numpy()
        rec["weights_shape"] = list(w.shape)
        rec["lam"] = {"w_min": float(np.min(w)), "w_max": float(np.max(w))}
        rec["hyper_steps"] = len(callbacks[0].history)
    return rec


def table(records: list[dict[str, Any]]) -> str:
    rows = ["| structure | oracle max abs diff (seeds) | decayed tensors (oracle) | λ learned, "
            "range (hyper steps) | test loss own → learned (means) | learned − own (worse/seeds) | "
            "learned − implicit (worse/seeds) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name in dict.fromkeys(r["recipe"] for r in records):
        rs = [r for r in records if r["recipe"] == name]
        orc = [r for r in rs if r["arm"] == "oracle"]
        diffs = [f"{r['max_abs_diff']:.1e}" for r in orc if "max_abs_diff" in r]
        errs = {r["error"][:80] for r in rs if r.get("error")}
        own = {r["seed"]: r["test_loss"] for r in rs if r["arm"] == "own" and "test_loss" in r}
        lrn = {r["seed"]: r for r in rs if r["arm"] == "learned" and "test_loss" in r}
        seeds = sorted(set(own) & set(lrn))
        lams = [v for s in seeds for v in (lrn[s].get("lam") or {}).values()]
        steps = [lrn[s].get("hyper_steps", 0) for s in seeds]
        lam = f"{min(lams):.1e}–{max(lams):.1e} ({min(steps)}–{max(steps)})" if lams else "—"
        nd = len(orc[0]["decayed"]) if orc and orc[0].get("decayed") else "—"
        if seeds:
            mo = np.mean([own[s] for s in seeds])
            ml = np.mean([lrn[s]["test_loss"] for s in seeds])
            cmp_ = f"{mo:.4f} → {ml:.4f}"
            d = paired(lrn[s]["test_loss"] - own[s] for s in seeds)
        else:
            cmp_ = d = "—"
        if errs:
            d += " ERROR: " + "; ".join(errs)
        imp = {r["seed"]: r["test_loss"] for r in rs if r["arm"] == "implicit" and "test_loss" in r}
        both = sorted(set(imp) & set(lrn))
        held = paired(lrn[s]["test_loss"] - imp[s] for s in both) if both else "—"
        rows.append(
            f"| {name} | {', '.join(diffs) or '—'} | {nd} | {lam} | {cmp_} | {d} | {held} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--structures", nargs="+", default=list(STRUCTURES) + list(DW_RECIPES))
    p.add_argument("--arms", nargs="+", default=["oracle", "own", "learned"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--table", action="store_true")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_records(args.out)))
        return
    torch.set_num_threads(1)
    command = " ".join(["python", *sys.argv])
    old = read_records(args.out)
    for seed in args.seeds:
        for name in args.structures:
            if name in DW_RECIPES:
                recs = [dw_fit(name, seed, arm) for arm in ("plain", "learned")]
            else:
                arms = [a for a in args.arms if a != "oracle" or seed == args.seeds[0]]
                recs = run_structure(name, seed, arms)
            for r in recs:
                r["command"] = command
                print({k: v for k, v in r.items() if k not in ("warnings", "command")}, flush=True)
                if r.get("warnings"):
                    print("   warnings:", r["warnings"], flush=True)
            old = merge_records(old, recs, recipe_key)
            write_json(args.out, {"command": command, "records": old})


if __name__ == "__main__":
    main()
