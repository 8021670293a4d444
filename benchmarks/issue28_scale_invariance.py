"""Why the learned λ falls on the CNNs (issue 28): per-layer evidence on one setting and seed.

Two measurements, each one training of ``bench_weight_decay.py``'s setting (same data split,
initial weights and batch order as the benchmark's seed):

``trace``   the default ``LearnedWeightDecay`` (per layer); at every hyper step, per λ slot:
            λ, the hypergradient (∂E/∂log λ), ‖w‖, the cosine of the validation gradient ∇E
            with w, and whether the slot is scale-invariant (:func:`scale_invariant_slots`:
            the training loss unchanged when the slot's tensors are scaled, in train mode).
``fixed``   fixed decays, one training each: λ on the scale-invariant slots only, on the
            others only, on all (the grid's uniform λ), none — which layers the grid's gain
            comes from.

Usage (from the repository root)::

    python benchmarks/issue28_scale_invariance.py trace --setting fashion_cnn --seed 4 \\
        --out benchmarks/results/weight_decay/runs/issue28_scale/trace_fashion_cnn_seed4.json
    python benchmarks/issue28_scale_invariance.py fixed --setting fashion_cnn --seed 4 \\
        --lam 2.5e-3 --out benchmarks/results/weight_decay/runs/issue28_scale/fixed_..._seed4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as bwd  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402
from hypertorch_sid.lightning.weight_decay import scale_invariant_slots  # noqa: E402


class TracedDecay(LearnedWeightDecay):
    """The default drop-in, recording per-slot evidence after every hyper step."""

    def __init__(self, data: bwd.Data, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[dict[str, Any]] = []
        self.found: dict[str, bool] = {}
        self._val = (data.X_val[:1000], data.y_val[:1000])
        self._train = (data.X_train[:256], data.y_train[:256])

    def _hyper_step(self, trainer: Any, pl_module: Any) -> None:
        super()._hyper_step(trainer, pl_module)
        decay = self.problem.decay
        if decay is None or self.last_hypergradient is None:
            return
        if not self.found:
            self.found = scale_invariant_slots(self.problem, pl_module, self._train)
        params = {e.name: e.param for e in decay.entries}
        with torch.enable_grad():
            x, y = self._val
            loss = F.cross_entropy(pl_module(x), y)  # train mode, as E in the hyper steps
            grads = torch.autograd.grad(loss, list(params.values()))
        by_name = dict(zip(params, grads))
        lam = decay.summary()
        hg = self.last_hypergradient[0]
        row: dict[str, Any] = {"step": trainer.global_step, "slots": {}}
        for i, slot in enumerate(decay.slot_names):
            names = [e.name for e in decay.entries if e.slot == i]
            w = torch.cat([params[n].detach().flatten() for n in names])
            g = torch.cat([by_name[n].flatten() for n in names])
            row["slots"][slot] = {
                "lambda": float(lam[i]),
                "hypergradient": float(hg[i]),
                "w_norm": float(w.norm()),
                "cos_gradE_w": float(g @ w / (g.norm() * w.norm() + 1e-30)),
                "gradE_norm": float(g.norm()),
                "scale_invariant": self.found.get(slot),
            }
        self.trace.append(row)


def trace(args: argparse.Namespace) -> dict[str, Any]:
    s = bwd.SETTINGS[args.setting]
    data = bwd.make_data(s, args.fashion_data if s.data == "fashion" else args.data, args.seed)
    holder: dict[str, Any] = {}
    import hypertorch_sid

    real = hypertorch_sid.LearnedWeightDecay

    def factory(*a: Any, **k: Any) -> TracedDecay:
        cb = TracedDecay(data, *a, **k)
        holder["cb"] = cb
        return cb

    hypertorch_sid.LearnedWeightDecay = factory  # train_once imports it from the package
    try:
        rec = bwd.train_once(s, data, args.seed, granularity="per_layer")
    finally:
        hypertorch_sid.LearnedWeightDecay = real
    cb = holder["cb"]
    keep = ("test_loss", "best_val_loss", "best_epoch", "val_curve", "lambda_by_slot", "error")
    return {"record": {k: rec[k] for k in keep}, "invariant": cb.found, "trace": cb.trace}


def fixed(args: argparse.Namespace) -> dict[str, Any]:
    """Trainings with λ on chosen slots (the optimizer's own coupled weight_decay per group)."""
    s = bwd.SETTINGS[args.setting]
    data = bwd.make_data(s, args.fashion_data if s.data == "fashion" else args.data, args.seed)
    probe = bwd.Classifier(s, 0.0)
    from hypertorch_sid.core.decay import WeightDecay

    decay = WeightDecay(probe.named_parameters(), 1e-4, granularity="per_layer")

    class _Problem:  # what scale_invariant_slots reads: decay and the data loss
        def __init__(self) -> None:
            self.decay = decay

        def data_loss(self, module: Any, batch: Any, which: str) -> torch.Tensor:
            return module.training_step(batch, 0)

    torch.manual_seed(args.seed)
    invariant = scale_invariant_slots(_Problem(), probe, (data.X_train[:256], data.y_train[:256]))
    inv_names = {e.name for e in decay.entries if invariant[decay.slot_names[e.slot]]}
    arms = {"none": set(), "invariant": inv_names, "others": {e.name for e in decay.entries}
            - inv_names, "all": {e.name for e in decay.entries}}  # fmt: skip
    out: dict[str, Any] = {"invariant": invariant, "lam": args.lam, "arms": {}}
    real = bwd.Classifier.configure_optimizers
    for arm, names in arms.items():

        def configure(self: Any, names: set[str] = names) -> torch.optim.Optimizer:
            on = [p for n, p in self.named_parameters() if n in names]
            off = [p for n, p in self.named_parameters() if n not in names]
            groups = [{"params": on, "weight_decay": args.lam}, {"params": off, "weight_decay": 0}]
            groups = [g for g in groups if g["params"]]
            if s.optimizer == "sgd":
                return torch.optim.SGD(groups, lr=s.lr, momentum=s.momentum)
            return torch.optim.Adam(groups, lr=s.lr)

        bwd.Classifier.configure_optimizers = configure  # type: ignore[method-assign]
        try:
            rec = bwd.train_once(s, data, args.seed, weight_decay=0.0)
        finally:
            bwd.Classifier.configure_optimizers = real  # type: ignore[method-assign]
        out["arms"][arm] = {k: rec[k] for k in ("test_loss", "best_val_loss", "best_epoch")}
        print(arm, out["arms"][arm], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("trace", "fixed"))
    p.add_argument("--setting", default="fashion_cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lam", type=float, default=2.5e-3)
    p.add_argument("--data", type=Path, default=bwd.DEFAULT_DATA)
    p.add_argument("--fashion-data", type=Path, default=bwd.DEFAULT_FASHION)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    result = trace(args) if args.what == "trace" else fixed(args)
    result["command"] = "python benchmarks/issue28_scale_invariance.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "trace"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
