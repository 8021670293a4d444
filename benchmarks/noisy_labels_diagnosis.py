"""What is the remaining symmetric-noise gap of the data-weights drop-in made of? (issue 27)

For each data set, noise and seed (the clipped recipe of ``bench_noisy_labels.py``), in one
process:

* ``plain`` and ``oracle`` (as in the benchmark);
* ``drop_in``: ``LearnedDataWeights(objective="mean_loss")`` (the default when this ran; E = the
  validation cross entropy), instrumented: every visit of a row by the
  training batches' cross term (step, index, uᵢ, its batch's ω-weighted mean ū, the hypergradient
  gᵢ, the logit before and after, the row's Adam scale), and after every epoch each training
  example's probability of its (noisy) label and whether the network predicts it;
* ``hindsight``: the same network trained from scratch with the drop-in's FINAL weights fixed
  from step 0 (ℓ̂ = Σωᵢℓᵢ/Σωᵢ, the drop-in's own loss): if it reaches ~the oracle, the weights
  are good and the gap is *when* they become good;
* ``hindsight100``: the same weights, but only after 100 plain steps (the drop-in's warm-up):
  what the warm-up alone costs.

Writes JSON (``--out``) with the accuracies and a per-row summary of the visits; the analysis
(``--analyse FILE``) prints the tables of docs/data_weights.md's diagnosis section.

Usage (from the repository root)::

    python benchmarks/noisy_labels_diagnosis.py --datasets fashion --noise symmetric --seeds 1 2 \\
        --out benchmarks/results/noisy_labels/runs/diagnosis/fashion.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_noisy_labels as bench  # noqa: E402

from hypertorch_sid import IndexedDataset  # noqa: E402
from hypertorch_sid.core import sample_weights as sw  # noqa: E402


def read_json(path: Path) -> Any:
    """A result file, gzipped where it ends in .gz (the visit logs: ~0.7 MB instead of 7)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def diagnosed_runs(path: Path) -> Any:
    """Each (setting, seed) of a diagnosis JSON (``main``'s output) with its data set rebuilt:
    yields (setting name, seed, the diagnosis' record, the noisy setting ``d``, its
    ``IndexedDataset``, the benchmark's args); the recipe is the diagnosis' (12 epochs, clip 1,
    one thread)."""
    diag = read_json(path)
    args = bench.parse(["--epochs", "12", "--clip", "1"])
    torch.set_num_threads(1)
    for name, seeds in diag["settings"].items():
        ds, kind = name.split("_")[0], name.split("_")[1].rstrip("0123456789")
        arrays = bench.load(ds, args.data)
        for seed, r in seeds.items():
            d = bench.noisy_setting(arrays, kind, args, int(seed))
            data = IndexedDataset(TensorDataset(d["X"], d["y_noisy"]))
            yield name, seed, r, d, data, args


def write_json(path: Path, obj: Any) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        json.dump(obj, f, separators=(",", ":"))


def compact(x: Any) -> Any:
    """4 significant digits for floats, 0/1 for booleans: the logs' size, not their content."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, list):
        return [compact(v) for v in x]
    if isinstance(x, dict):
        return {k: compact(v) for k, v in x.items()}
    return x


class FixedWeights(bench.Classifier):
    """The drop-in's loss Σωᵢℓᵢ/Σωᵢ with ω fixed (from step ``start`` on; plain before)."""

    def __init__(self, lr: float, weights: Tensor, start: int = 0) -> None:
        super().__init__(lr, reduction="none")
        self.fixed, self.start = weights, start

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        index, (x, y) = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        if self.global_step < self.start:
            return losses.mean()
        w = self.fixed[index]
        return (w * losses).sum() / w.sum()


class Recorder:
    """Every visit of a row by the training cross term (patched into TrainingCrossTerm)."""

    def __init__(self) -> None:
        self.visits: list[dict[str, Any]] = []
        self.step = 0
        self._last: dict[str, Any] | None = None
        self._grads = sw.TrainingCrossTerm.gradients
        self._apply = sw.TrainingCrossTerm.apply

    def install(self) -> None:
        rec = self

        def gradients(self, index, u, alpha, losses=None):  # type: ignore[no-untyped-def]
            out = rec._grads(self, index, u, alpha, losses)
            x = self.weights.logits.detach().index_select(0, index).clone()
            omega = torch.sigmoid(x)
            ubar = float((omega * u).sum() / omega.sum())
            rec._last = {
                "index": index.clone(),
                "u": u.detach().clone(),
                "ubar": ubar,
                "g": out[0].coalesce().to_dense()[index].clone(),
                "x0": x,
                "loss": None if losses is None else losses.detach().clone(),
            }
            return out

        def apply(self, gradient):  # type: ignore[no-untyped-def]
            rec._apply(self, gradient)
            last = rec._last
            if last is None:
                return
            opt_state = self.optimizer.state[self.weights.logits]
            idx = last["index"]
            last["x1"] = self.weights.logits.detach().index_select(0, idx).clone()
            last["v"] = opt_state["exp_avg_sq"].index_select(0, idx).clone()
            last["t"] = opt_state["visits"].index_select(0, idx).clone()
            last["step"] = rec.step
            rec.visits.append(last)
            rec._last = None

        sw.TrainingCrossTerm.gradients = gradients  # type: ignore[method-assign]
        sw.TrainingCrossTerm.apply = apply  # type: ignore[method-assign]

    def uninstall(self) -> None:
        sw.TrainingCrossTerm.gradients = self._grads  # type: ignore[method-assign]
        sw.TrainingCrossTerm.apply = self._apply  # type: ignore[method-assign]


class Steps(pl.Callback):
    def __init__(self, rec: Recorder, d: dict[str, Any]) -> None:
        self.rec, self.d, self.epochs = rec, d, []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):  # type: ignore[no-untyped-def]
        self.rec.step = trainer.global_step

    def on_train_epoch_end(self, trainer, module):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            module.net.eval()
            logits = module.net(self.d["X"])
            module.net.train()
        p = F.softmax(logits, 1)
        self.epochs.append({
            "epoch": trainer.current_epoch + 1,
            "p_noisy": p.gather(1, self.d["y_noisy"][:, None]).squeeze(1).tolist(),
            "pred_noisy": (logits.argmax(1) == self.d["y_noisy"]).tolist(),
            "pred_true": (logits.argmax(1) == self.d["y"]).tolist(),
            "test_acc": float(bench.accuracy(module.net, self.d["Xt"], self.d["yt"]).float().mean()),  # noqa: E501
        })  # fmt: skip


def fit(model: pl.LightningModule, data: Any, d: dict[str, Any], args: Any, seed: int,
        callbacks: list[Any], val: bool = False) -> tuple[float, float]:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, generator=gen)
    vl = DataLoader(TensorDataset(d["Xv"], d["yv"]), batch_size=args.batch) if val else None
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench.trainer(args.epochs, callbacks, args.clip).fit(model, loader, vl)
    acc = float(bench.accuracy(model.net, d["Xt"], d["yt"]).float().mean())
    return acc, time.process_time() - t0


def run_seed(d: dict[str, Any], args: Any, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method in ("plain", "oracle"):
        out[method] = bench.train(method, d, args, seed)["test_acc"]
    torch.manual_seed(seed)
    rec = Recorder()
    rec.install()
    try:
        model = bench.Classifier(args.lr, reduction="none")
        cb = bench.LearnedDataWeights(seed=seed, objective=args.objective)
        steps = Steps(rec, d)
        data = IndexedDataset(TensorDataset(d["X"], d["y_noisy"]))
        out["drop_in"], out["drop_in_cpu"] = fit(model, data, d, args, seed, [cb, steps], True)
    finally:
        rec.uninstall()
    w = cb.data_weights()
    out["weights"] = [round(float(v), 5) for v in w]
    out["epochs"] = steps.epochs
    visits = {k: torch.cat([v[k].reshape(-1) for v in rec.visits]).tolist()
              for k in ("index", "u", "g", "x0", "x1", "v", "t", "loss")}  # fmt: skip
    visits["ubar"] = [v["ubar"] for v in rec.visits for _ in range(len(v["index"]))]
    visits["step"] = [v["step"] for v in rec.visits for _ in range(len(v["index"]))]
    out["visits"] = visits
    data = IndexedDataset(TensorDataset(d["X"], d["y_noisy"]))
    for name, start in (("hindsight", 0), ("hindsight100", 100)):
        torch.manual_seed(seed)
        model = FixedWeights(args.lr, w.clone(), start)
        out[name], out[name + "_cpu"] = fit(model, data, d, args, seed, [])
    print(f"seed {seed}: " + ", ".join(f"{k} {out[k]:.4f}" for k in
          ("plain", "oracle", "drop_in", "hindsight", "hindsight100")), flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--datasets", nargs="+", default=["fashion"])
    p.add_argument("--noise", nargs="+", default=["symmetric"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path)
    p.add_argument("--analyse", type=Path, nargs="*")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument(
        "--objective", default="mean_loss",
        help="the drop-in's objective= (mean_loss: the default when the diagnosis ran)",
    )  # fmt: skip
    p.add_argument(
        "--pairs", type=Path, nargs="*",
        help="which (true → noisy) class pairs the corrupted rows with ω ≥ 0.25 come from",
    )  # fmt: skip
    a = p.parse_args(argv)
    if a.analyse:
        for path in a.analyse:
            analyse(read_json(path))
        return
    if a.pairs:
        for path in a.pairs:
            pairs(read_json(path))
        return
    args = bench.parse(["--epochs", str(a.epochs), "--clip", "1"])
    args.objective = a.objective
    torch.set_num_threads(1)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "settings": {}}
    for ds in a.datasets:
        arrays = bench.load(ds, args.data)
        for kind in a.noise:
            name = f"{ds}_{kind}40"
            result["settings"][name] = {}
            for seed in a.seeds:
                d = bench.noisy_setting(arrays, kind, args, seed)
                rec = run_seed(d, args, seed)
                rec["clean"] = d["clean"].tolist()
                result["settings"][name][str(seed)] = rec
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, compact(result))
    print("wrote", a.out)


def analyse(result: dict[str, Any]) -> None:
    for name, seeds in result["settings"].items():
        for seed, r in seeds.items():
            clean = np.array(r["clean"], dtype=bool)
            w = np.array(r["weights"])
            o, pl_, m = r["oracle"], r["plain"], r["drop_in"]
            print(f"\n== {name} seed {seed}: plain {pl_:.4f} oracle {o:.4f} drop-in {m:.4f} "
                  f"({(m - pl_) / (o - pl_):.0%} of the gap) hindsight {r['hindsight']:.4f} "
                  f"({(r['hindsight'] - pl_) / (o - pl_):.0%}) "
                  f"hindsight100 {r['hindsight100']:.4f} "
                  f"({(r['hindsight100'] - pl_) / (o - pl_):.0%})")  # fmt: skip
            eff = (w[~clean].sum()) / w.sum()
            print(f"final: mean ω clean {w[clean].mean():.3f} corrupted {w[~clean].mean():.3f}; "
                  f"corrupted share of the weighted loss {eff:.3f}; corrupted ω>0.5: "
                  f"{(w[~clean] > 0.5).sum()} of {(~clean).sum()}; clean ω<0.25: "
                  f"{(w[clean] < 0.25).sum()} of {clean.sum()}")  # fmt: skip
            v = {k: np.array(x) for k, x in r["visits"].items()}
            idx = v["index"].astype(int)
            evid = v["u"] - v["ubar"]
            step = v["x1"] - v["x0"]
            epoch_of = v["step"] // 32
            corrupt_row = ~clean[idx]
            # groups: corrupted kept (final ω > 0.5), corrupted down (ω < 0.25), clean lost
            groups = {
                "corrupted kept (ω>0.5)": ~clean & (w > 0.5),
                "corrupted mid (0.25-0.5)": ~clean & (w >= 0.25) & (w <= 0.5),
                "corrupted down (ω<0.25)": ~clean & (w < 0.25),
                "clean lost (ω<0.25)": clean & (w < 0.25),
                "clean kept (ω>0.5)": clean & (w > 0.5),
            }
            ep = r["epochs"]
            pred_noisy = np.array([e["pred_noisy"] for e in ep])  # (epochs, n)
            p_noisy = np.array([e["p_noisy"] for e in ep])
            print(
                "per epoch of the visit: mean evidence u−ū | mean Δx | mean |Δx| | "
                "share of rows memorised (network predicts the noisy label) at the epoch's end"
            )
            for gname, mask in groups.items():
                rows = mask[idx]
                if not rows.any():
                    continue
                cells = []
                for e in range(3, 12):
                    sel = rows & (epoch_of == e)
                    if not sel.any():
                        continue
                    mem = pred_noisy[e][mask].mean()
                    cells.append(f"e{e + 1}: {evid[sel].mean():+.2f} {step[sel].mean():+.2f} "
                                 f"{np.abs(step[sel]).mean():.2f} {mem:.2f}")  # fmt: skip
                print(f"  {gname} (n={mask.sum()}): " + " | ".join(cells))
            # (c) step size against sigma': corrupted rows, last visits
            sig = 1 / (1 + np.exp(-v["x0"]))
            sp = sig * (1 - sig)
            down = corrupt_row & (v["x0"] < -1)
            rms = np.sqrt(v["v"][down] / (1 - 0.999 ** v["t"][down]))
            print(f"  (c) corrupted visits with x < −1: n={down.sum()}, mean σ'(x) "
                  f"{sp[down].mean():.3f} (x≈0: 0.25), |g|/RMS-scale "
                  f"{np.abs(v['g'][down] / rms).mean():.2f}, share of downward steps "
                  f"{(step[down] < 0).mean():.2f}, mean Δx {step[down].mean():+.2f}, "
                  f"share with upward evidence u>ū {(evid[down] > 0).mean():.2f}")  # fmt: skip
            first = corrupt_row & (v["t"] == 1)
            print(f"  corrupted first visits: mean |Δx| {np.abs(step[first]).mean():.2f}, "
                  f"downward share {(step[first] < 0).mean():.2f}; clean first visits downward "
                  f"share {(step[~corrupt_row & (v['t'] == 1)] < 0).mean():.2f}")  # fmt: skip
            last = {g: p_noisy[-1][m].mean() for g, m in groups.items()}
            print(f"  p(noisy label) at the end: corrupted kept "
                  f"{last['corrupted kept (ω>0.5)']:.2f}, corrupted down "
                  f"{last['corrupted down (ω<0.25)']:.2f}, clean lost "
                  f"{last['clean lost (ω<0.25)']:.2f}, clean kept "
                  f"{last['clean kept (ω>0.5)']:.2f}")  # fmt: skip
            print("  test acc per epoch (drop-in):", " ".join(f"{e['test_acc']:.3f}" for e in ep))


def pairs(result: dict[str, Any]) -> None:
    """The corrupted rows the weights keep (ω ≥ 0.25): from which class pairs, and how much
    probability the network gave their (wrong) label after epoch 4."""
    from collections import Counter

    args = bench.parse(["--epochs", "12", "--clip", "1"])
    for name, seeds in result["settings"].items():
        ds, kind = name.split("_")[0], name.split("_")[1].rstrip("0123456789")
        arrays = bench.load(ds, args.data)
        for seed, r in seeds.items():
            d = bench.noisy_setting(arrays, kind, args, int(seed))
            w, c = np.array(r["weights"]), d["clean"].numpy()
            y, yn = d["y"].numpy(), d["y_noisy"].numpy()
            kept = ~c & (w >= 0.25)
            pk, pa = Counter(zip(y[kept], yn[kept])), Counter(zip(y[~c], yn[~c]))
            top10 = [k for k, _ in pk.most_common(10)]
            held = sum(pk[k] for k in top10) / kept.sum()
            expect = sum(pa[k] for k in top10) / (~c).sum()
            rates = ", ".join(f"{t}→{n}: {v} of {pa[(t, n)]}" for (t, n), v in pk.most_common(6))
            p4 = np.array(r["epochs"][3]["p_noisy"])
            print(f"{name} seed {seed}: corrupted with ω ≥ 0.25: {kept.sum()} of {(~c).sum()}; "
                  f"most kept pairs (true→noisy: kept of all) {rates}; the 10 most kept pairs hold "
                  f"{held:.0%} of them and {expect:.0%} of all corrupted; p(noisy label) after "
                  f"epoch 4: kept {p4[kept].mean():.2f}, other corrupted "
                  f"{p4[~c & (w < 0.25)].mean():.2f}, clean {p4[c].mean():.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
