"""Session 61: the learned decay's hypergradient on ``two_opt_manual`` against a replayed reference.

The recipe of ``diag_two_opt_s59.py`` (Fashion-MNIST MLP 784-256-128-10, 2000 training and 300
validation images) in four variants: ``sgd_adam`` (the recipe: encoder by SGD momentum lr 0.05,
head by Adam lr 1e-3, toggled in turn under manual optimisation, StepLR per epoch), ``two_adam``
(Adam lr 1e-3 on the encoder too: two optimizers of one kind), ``one_adam`` (one Adam lr 1e-3,
automatic) and ``one_sgd`` (one SGD momentum lr 0.05, automatic). Each is fitted once with
``LearnedWeightDecay(5e-4)`` and every default, instrumented without changing the library:

* ``--mode frozen``: the outer step is skipped (λ stays 5e-4, so the training is the user's own
  recipe) and no hyper step is skipped for the budget (``max_overhead=None``): the library's
  hypergradient (d E / d log λ per slot; > 0 says "less decay") is read at every due step;
* ``--mode default``: the fit as a user runs it (the outer steps and the budget on).

At each hyper step the weights, the optimizers' states and the training batches are kept, and a
plain-PyTorch replay of the same training (the same batches in the same order, the same optimizers
and learning-rate schedule, ``grad += λw`` before each step, as the drop-in does) gives the
references: each slot's log λ perturbed by ±ε = 0.5 from that step to the fit's end, central
differences of the validation loss (all 300 images) at the end (``fd_end``), 10 batches later
(``fd_k``) and of the test loss at the end (``fd_test``). ``greedy``: the one-step dE/d log λ,
−λ⟨w, ∇E⟩ per slot (E on all 300 images), and ``greedy_own_step`` with each tensor's own
optimizer's gain. ``replay_gap``: the replay at the unperturbed λ from the last hyper step
against the Lightning fit's own end (it follows the fit to float rounding, 2e-8 over 10 batches).
``--kwargs``: more settings of the drop-in (e.g. ``'{"warm_start_adjoint": false}'``); the
summary borrows the replays of the default settings' frozen fit at the same steps (frozen fits
train alike).

Usage (repository root)::

    OMP_NUM_THREADS=1 python benchmarks/diag_two_opt_s61.py --data ../shared/data \
        --variants sgd_adam one_adam --seeds 3 4 5 6 7 8
    OMP_NUM_THREADS=1 python benchmarks/diag_two_opt_s61.py --data ../shared/data \
        --variants two_adam --seeds 3 4
    OMP_NUM_THREADS=1 python benchmarks/diag_two_opt_s61.py --data ../shared/data \
        --variants sgd_adam --seeds 3 4 5 --no-fd --kwargs '{"warm_start_adjoint": false}' \
        --out benchmarks/results/user_recipes/s61_two_opt/hypergradient_cold.json
    python benchmarks/diag_two_opt_s61.py --summary             # the table of the records
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s59 as s59  # noqa: E402
import diag_two_opt_s59 as s59d  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

OUT = Path("benchmarks/results/user_recipes/s61_two_opt")
EPS = 0.5  # ± in log λ
K = 10  # batches of the short horizon


class Batches(Callback):
    """Keeps every training batch, in the order the fit draws them."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((batch[0].clone(), batch[1].clone()))


class Recorded(LearnedWeightDecay):
    """The drop-in, keeping at each hyper step the state the training is in and the
    hypergradient it computed; ``frozen``: λ is not stepped."""

    def __init__(self, *args, frozen: bool, batches: Batches, **kw) -> None:
        super().__init__(*args, **kw)
        self.frozen, self.batches, self.records = frozen, batches, []

    def _hyper_step(self, trainer, pl_module) -> None:
        decay = self.problem.decay
        state = {
            "batch": len(self.batches.seen) - 1,  # the last batch done
            "step": trainer.global_step,
            "module": copy.deepcopy(pl_module.state_dict()),
            "optimizers": [copy.deepcopy(o.state_dict()) for o in trainer.optimizers],
            "lam": decay.summary().tolist(),
        }
        if self.frozen:
            self.sid.apply = lambda hypergrad: None  # noqa: ARG005 - λ kept
        super()._hyper_step(trainer, pl_module)
        g = self.last_hypergradient
        state["hypergradient"] = g[0].tolist() if g is not None else None
        state["sid"] = dict(self.sid.last)
        state["fell"] = list(getattr(self.sid.outer_optimizer, "fell", []))
        state["lam_after"] = decay.summary().tolist()
        state["slots"] = list(decay.slot_names)
        self.records.append(state)


# ----------------------------------------------------------------------------- the replay


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _adam(params):
    return torch.optim.Adam(params, lr=1e-3)


#: each variant's optimizers, as the replay builds them: (encoder's, head's) or (all tensors')
KINDS = {
    "sgd_adam": (_sgd, _adam),
    "two_adam": (_adam, _adam),
    "one_adam": (_adam,),
    "one_sgd": (_sgd,),
}


def _groups(variant: str, module) -> list[tuple[torch.optim.Optimizer, list[tuple[str, Any]]]]:
    """The replay's optimizers (fresh objects; states loaded by the caller) and their tensors."""
    kinds = KINDS[variant]
    if len(kinds) == 2:
        parts = [
            list(module.encoder.named_parameters(prefix="encoder")),
            list(module.head.named_parameters(prefix="head")),
        ]
    else:
        parts = [list(module.named_parameters())]
    return [(make([p for _, p in named]), named) for make, named in zip(kinds, parts)]


def _slot(name: str) -> str:
    return name.rpartition(".")[0]


def _lr_factor(variant: str, batch: int, per_epoch: int) -> float:
    return 0.3 ** ((batch // per_epoch) // 3) if len(KINDS[variant]) == 2 else 1.0


def _val(module, val) -> float:
    module.eval()
    with torch.no_grad():
        out = float(F.cross_entropy(module(val[0]), val[1]))
    module.train()
    return out


def replay(variant, module0, states, batches, start, lam, val, per_epoch, probe_at, test):
    """Train ``module0`` (a copy) from the state after batch ``start`` to the end with λ by slot
    ``lam``; the validation loss after batch ``probe_at`` and at the end, the test loss at the
    end."""
    module = copy.deepcopy(module0)
    opts = _groups(variant, module)
    base = [[g["lr"] for g in o.param_groups] for o, _ in opts]
    for (o, _), s in zip(opts, states):
        # a copy: load_state_dict keeps the given state tensors (CPU, same dtype), and the
        # replay's steps would move the kept snapshot's momentum and moments for the next one
        o.load_state_dict(copy.deepcopy(s))
    at_k = None
    for b in range(start + 1, len(batches)):
        x, y = batches[b]
        f = _lr_factor(variant, b, per_epoch)
        for (o, named), lrs in zip(opts, base):
            for g, lr in zip(o.param_groups, lrs):
                g["lr"] = lr * f
            mine = {id(p) for _, p in named}
            for p in module.parameters():
                p.requires_grad_(id(p) in mine)
            loss = F.cross_entropy(module(x), y)
            o.zero_grad()
            loss.backward()
            with torch.no_grad():
                for name, p in named:
                    p.grad.add_(p, alpha=lam[_slot(name)])
            o.step()
        for p in module.parameters():
            p.requires_grad_(True)
        if b == probe_at:
            at_k = _val(module, val)
    return at_k, _val(module, val), _val(module, test)


def greedy(variant, module0, states, lam, val):
    """Per slot, the one-step ("greedy") dE/d log λ at the state: −λ⟨w, ∇E⟩ (the plain GD map's,
    every tensor alike) and −λ⟨P w, ∇E⟩ with P each tensor's own optimizer's gain (SGD's
    lr/(1 − μ), Adam's lr/(√v̂ + ε)); E on all validation images."""
    module = copy.deepcopy(module0)
    opts = _groups(variant, module)
    for (o, _), st in zip(opts, states):
        o.load_state_dict(copy.deepcopy(st))
    module.zero_grad()
    F.cross_entropy(module(val[0]), val[1]).backward()
    plain: dict[str, float] = {}
    own: dict[str, float] = {}
    for o, named in opts:
        group = o.param_groups[0]
        for name, p in named:
            s = _slot(name)
            st = o.state.get(p, {})
            if isinstance(o, torch.optim.SGD):
                gain = group["lr"] / (1 - group["momentum"])
            else:
                v = st["exp_avg_sq"] / (1 - group["betas"][1] ** float(st["step"]))
                gain = group["lr"] / (v.sqrt() + group["eps"])
            dot = float((p.detach() * p.grad).sum())
            plain[s] = plain.get(s, 0.0) - lam[s] * dot
            own[s] = own.get(s, 0.0) - lam[s] * float((gain * p.detach() * p.grad).sum())
    return plain, own


# ----------------------------------------------------------------------------- one seed


class TwoAdam(s59.TwoOptimizers):
    """The recipe with Adam (lr 1e-3) on the encoder too: two optimizers of one kind."""

    def configure_optimizers(self):
        opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (self.encoder, self.head)]
        steps = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.3) for o in opts]
        return opts, steps


def model_of(variant: str):
    return {
        "sgd_adam": s59.TwoOptimizers,
        "two_adam": TwoAdam,
        "one_adam": s59d.OneAdam,
        "one_sgd": s57.MLP,
    }[variant](0.0, False)


def run(
    variant: str, seed: int, data: Path, mode: str, fd: bool = True, extra: dict | None = None
) -> dict:
    tr, va, te = images(data, "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    model = model_of(variant)
    module0 = copy.deepcopy(model)  # the architecture, for the replays
    batches = Batches()
    manual = len(KINDS[variant]) == 2
    kw: dict[str, Any] = {"frozen": mode == "frozen", "batches": batches}
    if manual:
        kw["training_loss"] = lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if mode == "frozen":
        kw["max_overhead"] = None
    cb = Recorded(5e-4, **kw, **(extra or {}))
    fit = trainer([batches, cb], 6)
    fit.fit(
        model,
        recipe_loader(train, None, 64, False, True),
        recipe_loader(val, None, 64, False, False),
    )
    per_epoch = len(batches.seen) // 6
    lightning_end = _val(model, val.tensors)
    t_loss, _ = test_loss(model, recipe_loader(test, None, 64, False, False))
    points = []
    for r in cb.records:
        module0.load_state_dict(r["module"])
        lam = dict(zip(r["slots"], r["lam"]))
        probe = min(r["batch"] + K, len(batches.seen) - 1)
        replayed = dict(
            zip(("k", "end", "test"), replay(variant, module0, r["optimizers"], batches.seen,
                                             r["batch"], lam, val.tensors, per_epoch, probe,
                                             test.tensors))
        )  # fmt: skip
        plain, own = greedy(variant, module0, r["optimizers"], lam, val.tensors)
        point = {
            "greedy": plain,
            "greedy_own_step": own,
            "step": r["step"],
            "batch": r["batch"],
            "lam": lam,
            "hypergradient": dict(zip(r["slots"], r["hypergradient"] or [])),
            "sid": r["sid"],
            "fell": r["fell"],
            "lam_after": dict(zip(r["slots"], r["lam_after"])),
            "base": replayed,
            "fd_k": {},
            "fd_end": {},
            "fd_test": {},
        }
        for s in r["slots"] if fd else ():
            ends = []
            for sign in (1, -1):
                moved = dict(lam, **{s: lam[s] * math.exp(sign * EPS)})
                ends.append(
                    replay(variant, module0, r["optimizers"], batches.seen, r["batch"], moved,
                           val.tensors, per_epoch, probe, test.tensors)
                )  # fmt: skip
            for i, key in enumerate(("fd_k", "fd_end", "fd_test")):
                point[key][s] = (ends[0][i] - ends[1][i]) / (2 * EPS)
        points.append(point)
        print(
            variant, seed, r["step"], {s: f"{plain[s]:+.2e}" for s in r["slots"]},
            {s: f"{point['hypergradient'].get(s, math.nan):+.2e}" for s in r["slots"]},
            {s: f"{point['fd_end'][s]:+.2e}" for s in point["fd_end"]},
            {s: f"{point['fd_test'][s]:+.2e}" for s in point["fd_test"]},
            flush=True,
        )  # fmt: skip
    return {
        "variant": variant,
        "seed": seed,
        "mode": mode,
        "fd": fd,
        "kwargs": extra or {},
        "test_loss": t_loss,
        "val_loss_end": lightning_end,
        "replay_gap": (points[-1]["base"]["end"] - lightning_end) if mode == "frozen" else None,
        "lam_end": {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()},
        "points": points,
    }


def _key(r: dict) -> tuple:
    return r["variant"], r["seed"], r["mode"], r.get("fd", True), json.dumps(r.get("kwargs", {}))


def _group(r: dict) -> tuple:
    return r["variant"], r["mode"], r.get("fd", True), json.dumps(r.get("kwargs", {}))


def _in_half(half: str, r: dict, p: dict) -> bool:
    """Whether hyper step ``p`` of fit ``r`` is in the ``half`` ("all", "first", "second")."""
    return half == "all" or (half == "first") == (p["step"] < r["points"][-1]["step"] / 2)


def _mean(xs: list[float]) -> str:
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else math.nan
    return f"{statistics.mean(xs):+.1e} ± {se:.1e} ({sum(x > 0 for x in xs)}/{len(xs)} > 0)"


def summary(recs: list[dict]) -> None:
    """Per variant and slot, over the seeds' hyper steps (all, first and second half of the
    fit): the library's hypergradient, the greedy one, and each reference (mean ± s.e., how many
    > 0, i.e. "less decay"), with how often the library's sign agrees with it."""
    # frozen fits train alike whatever the hyper step's settings: their replays are shared
    replayed = {
        (r["variant"], r["seed"], p["step"]): p
        for r in recs
        if r["mode"] == "frozen" and r.get("fd", True)
        for p in r["points"]
    }
    for group in sorted({_group(r) for r in recs}):
        variant, mode, fd, extra = group
        rs = [r for r in recs if _group(r) == group]
        if mode == "frozen":
            for r in rs:
                for p in r["points"]:
                    for key in ("fd_k", "fd_end", "fd_test"):
                        if not p.get(key):
                            p[key] = replayed.get((variant, r["seed"], p["step"]), {}).get(key, {})
        how = ("" if fd else " (no replays of its own)") + ("" if extra == "{}" else f" {extra}")
        print(f"== {variant} {mode}{how}, seeds {[r['seed'] for r in rs]}")
        for half in ("all", "first", "second"):
            for s in rs[0]["points"][0]["hypergradient"]:
                pts = [p for r in rs for p in r["points"] if _in_half(half, r, p)]
                lib = [p["hypergradient"][s] for p in pts]
                line = f"{half:6s} {s:10s} library {_mean(lib)}"
                for key in ("greedy", "fd_k", "fd_end", "fd_test"):
                    ref = [p[key][s] for p in pts if s in p.get(key, {})]
                    if ref and len(ref) == len(lib):
                        agree = sum((a > 0) == (b > 0) for a, b in zip(lib, ref))
                        line += f" | {key} {_mean(ref)}, agree {agree}/{len(ref)}"
                print(line)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5])
    p.add_argument("--variants", nargs="+", default=["sgd_adam", "one_adam"])
    p.add_argument("--mode", choices=("frozen", "default"), default="frozen")
    p.add_argument("--out", type=Path, default=OUT / "hypergradient_fd.json")
    p.add_argument(
        "--fd",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-fd: the hypergradients and the greedy ones only, no replays",
    )
    p.add_argument("--summary", action="store_true", help="print the table of --out and stop")
    p.add_argument(
        "--kwargs",
        type=json.loads,
        default={},
        help="more LearnedWeightDecay settings, e.g. '{\"warm_start_adjoint\": false}'",
    )
    args = p.parse_args()
    recs = json.loads(args.out.read_text()) if args.out.exists() else []
    if args.summary:
        summary(recs)
        return
    torch.set_num_threads(1)
    for seed in args.seeds:
        for variant in args.variants:
            rec = run(variant, seed, args.data, args.mode, args.fd, args.kwargs)
            key = (variant, seed, args.mode, args.fd, json.dumps(args.kwargs))
            recs = [r for r in recs if _key(r) != key] + [rec]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
