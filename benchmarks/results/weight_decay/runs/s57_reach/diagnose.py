"""Session 57 diagnosis, from stored runs only: on digits_small (the main job's recipe), seeds 0-8,
the λ the grid and Optuna picked (session 43's deployment file) and where today's default put λ
per layer at steps 100, 200, the deployed checkpoint and the end, with its hyper steps (session
53's traced default, s53_late/deployed.json, arm ctl), and the log-λ moves of the first layer
after step 200. Writes diagnosis.md here.

usage (from anywhere): python diagnose.py
"""

import json
import math
from pathlib import Path

here = Path(__file__).resolve().parent
dep = json.loads((here.parents[1] / "weight_decay_deployment_9seeds_final_s43.json").read_text())
dep = dep["deployment"]["settings"]["digits_small"]
ctl = json.loads((here.parent / "s53_late" / "deployed.json").read_text())["ctl"]


def lam_at(trace: list, step: int) -> list[float]:
    lam = [1e-4] * 3  # λ₀ before the first hyper step
    for s, v in trace:
        if s <= step:
            lam = v
    return lam


def f(v: list[float]) -> str:
    return " / ".join(f"{x:.0e}" for x in v)


rows = [
    "| seed | grid's pick λ | Optuna's pick λ | default λ per layer at step 100 | at step 200 "
    "| at the deployed checkpoint (step) | at the end (400) | hyper steps (after step 200) "
    "| log-λ moves of layer 1 after step 200 (sum) | test loss: default / grid / Optuna |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
for k in map(str, range(9)):
    g, o, c = dep["grid pick"]["seeds"][k], dep["Optuna pick"]["seeds"][k], ctl[k]
    tr = c["trace"]
    moves, prev = [], 1e-4
    for s, v in tr:
        if s > 200:
            moves.append(math.log(v[0] / prev))
        prev = v[0]
    rows.append(
        f"| {k} | {g['weight_decay']:.1e} | {o['weight_decay']:.1e} | {f(lam_at(tr, 100))} "
        f"| {f(lam_at(tr, 200))} | {f(lam_at(tr, c['best_step']))} ({c['best_step']}) "
        f"| {f(tr[-1][1])} | {len(tr)} ({sum(s > 200 for s, _ in tr)}) "
        f"| {', '.join(f'{m:+.2f}' for m in moves)} ({sum(moves):+.1f}) "
        f"| {c['test_loss']:.4f} / {g['test_loss']:.4f} / {o['test_loss']:.4f} |"
    )
(here / "diagnosis.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
