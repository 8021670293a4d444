"""One SID drop-in variant on benchopt's data cleaning outside benchopt, for a fixed CPU-time budget
(load-independent): the solver's ``DropIn`` class on ``bench_data_cleaning.load_problem``'s split,
x₀ = −2, z₀ = 0, seed 1; test error and f of its iterate and of its weights re-solved by L-BFGS,
and the flags. Used to check whether a smaller outer learning rate grades the weights (it did not).

    ../venv-benchopt/bin/python benchmarks/benchopt/probe_drop_in.py 0.5 35 '{}' '{"outer_lr": 0.1}'

Each further argument is a JSON dict of ``LearnedDataWeights`` arguments; results in
``$BENCH_DC_OUT/probe_drop_in_p<p>.json``.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "solvers"), str(HERE.parents[1])]
import bench_data_cleaning as dc  # noqa: E402
import sid  # noqa: E402


def main(p: float, budget: float, variants: list[str]) -> None:
    torch.set_num_threads(1)
    problem = dc.load_problem(dc.BENCH_DIR / "mnist.pkl", p)
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    X, Xv = t(problem["X_train"]), t(problem["X_val"])
    y, yv = torch.as_tensor(problem["y_train"]), torch.as_tensor(problem["y_val"])
    out = {}
    for variant in variants:
        torch.manual_seed(1)
        x0 = torch.full((len(y),), -2.0)
        m = sid.DropIn(
            X, y, Xv, yv, torch.zeros(784, 10), x0, dc.REG, 256, 1.0, 1, **json.loads(variant)
        )
        start = time.process_time()
        while time.process_time() - start < budget:
            for _ in range(m.every):
                m.step()
        z = m.z.detach().t().double().numpy()
        w = torch.sigmoid(m.weights.logits.detach().double()).numpy()
        r = dict(
            cpu_s=budget,
            samples=float(m.samples),
            iterate_test_error=dc.error(z, problem["X_test"], problem["y_test"]),
            iterate_val_loss=dc.val_loss(z, problem["X_val"], problem["y_val"]),
            **dc.resolve(problem, w),
        )
        flags = dc.flagging(w, problem["corrupted"])
        r.update(
            {k: flags[k] for k in ("flagged_precision", "flagged_recall", "average_precision")}
        )
        out[variant] = r
        print(p, variant, {k: round(v, 4) for k, v in r.items()}, flush=True)
    dc.OUT.mkdir(parents=True, exist_ok=True)
    (dc.OUT / f"probe_drop_in_p{p}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:] or ["{}"])
