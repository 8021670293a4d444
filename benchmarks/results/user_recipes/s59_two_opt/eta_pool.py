"""Session 59 (lead): is the two_opt_manual miss the pooled η? The decay arm with today's η (SGD
pooled by its element count, Adam by v̂) against η pooled by mean-square gradient for both,
alternating seed by seed. usage (repository root):
python benchmarks/results/user_recipes/s59_two_opt/eta_pool.py  (writes eta_pool.json beside it)"""

import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import diag_two_opt_s59 as D  # noqa: E402

import hypertorch_sid.lightning.callback as C  # noqa: E402
from hypertorch_sid.core import horizon as H  # noqa: E402

SEEDS = [3, 4, 5, 6, 7, 8]
orig = C.effective_step_size
seen: dict[str, list] = {"orig": [], "g2": []}


def g2_pooled(optimizers):
    """η pooled by mean-square gradient for every optimizer: SGD weighted by its momentum
    buffer's steady-state gradient² (b(1 − μ)/(1 − d))², Adam by v̂ (as today)."""
    num = den = 0.0
    for opt in optimizers:
        sgd = isinstance(opt, torch.optim.SGD)
        for group in opt.param_groups:
            lr = float(group.get("lr", 0.0) or 0.0)
            mu = float(group.get("momentum", 0.0) or 0.0)
            damp = float(group.get("dampening", 0.0) or 0.0) if mu > 0 else 0.0
            for p in group["params"]:
                st = opt.state.get(p, {})
                if sgd:
                    b = st.get("momentum_buffer")
                    g = b * (1 - mu) / (1 - damp) if b is not None else p.grad
                    if g is None:
                        continue
                    d = float(g.double().pow(2).sum())
                    n = d * lr * (1 - damp) / (1 - mu)
                elif "exp_avg_sq" in st and "step" in st:
                    n, d = H._adam_step(st, group, lr)
                else:
                    continue
                num, den = num + n, den + d
    eta = num / den if den > 0 else math.nan
    return eta if math.isfinite(eta) and eta > 0 else None


def recording(kind):
    def read(opts, share=None):  # share: each optimizer's steps of R (session 61, eq. stepshare)
        opts = list(opts)
        a, b = orig(opts, share), g2_pooled(opts)
        seen["orig"].append(a)
        seen["g2"].append(b)
        return a if kind == "orig" else b

    return read


def main() -> None:
    recs = []
    for seed in SEEDS:
        for kind in ("orig", "g2"):
            C.effective_step_size = recording(kind)
            r = D.fit("sgd_adam", "decay", seed, Path("../shared/data"))
            r["kind"] = kind
            recs.append(r)
            print(kind, seed, round(r["test_loss"], 4), round(r["val_loss"], 4), r["lam"])
    for kind in ("orig", "g2"):
        print(f"η {kind} median", statistics.median(x for x in seen[kind] if x))

    def loss(s, kind):
        return next(r["test_loss"] for r in recs if r["seed"] == s and r["kind"] == kind)

    d = [loss(s, "g2") - loss(s, "orig") for s in SEEDS]
    se = statistics.stdev(d) / len(d) ** 0.5
    print(f"g2 - orig test {statistics.fmean(d):+.4f} ± {se:.4f} worse {sum(x > 0 for x in d)}/6")
    Path(__file__).with_suffix(".json").write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
