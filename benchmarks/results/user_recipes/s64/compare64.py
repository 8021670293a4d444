"""Session 64's paired table: each fit's deployed test loss (accuracy) under today's default
(``dw``: ``records_dw_s63.json`` / ``records_dw_s50.json``, the traj64 runs) against
``no_signal=ResetWeights()`` / ``ShrinkWeights(0.5)`` (``records.json``) and plain training
on the same noisy data (session 63's ``records.json`` / ``records_fresh.json``).

    cd benchmarks/results/user_recipes/s64 && python compare64.py [records_fresh.json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_SIGNAL = ("vae_mnist", "gce_fmnist", "char_cnn")


def records(path: Path) -> list[dict]:
    got = json.loads(path.read_text())
    return got["records"] if isinstance(got, dict) else got


def keyed(recs: list[dict], arm: str | None = None) -> dict[tuple[str, int], dict]:
    return {(r["recipe"], r["seed"]): r for r in recs if arm is None or r["arm"] == arm}


def main(fresh: str | None = None) -> None:
    if fresh is None:
        s63 = HERE.parent / "s63"
        plain = keyed(records(s63 / "records.json") + records(s63 / "records_fresh.json"), "plain")
        dw = keyed(records(HERE / "records_dw_s63.json") + records(HERE / "records_dw_s50.json"))
        mine = records(HERE / "records.json")
    else:
        mine = records(HERE / fresh)
        plain, dw = keyed(mine, "plain"), keyed(mine, "dw")
    arms = {a: keyed(mine, a) for a in ("reset", "shrink")}
    print("| fit | plain | dw | reset | reset − dw | shrink − dw | settled at | reset − plain |")
    print("|---|---|---|---|---|---|---|---|")
    gains: dict[str, list[float]] = {"no signal": [], "separating": []}
    for key in sorted(dw, key=lambda k: (k[0] not in NO_SIGNAL, k)):
        if key not in arms["reset"]:
            continue
        d, r, s, p = dw[key], arms["reset"][key], arms["shrink"].get(key), plain.get(key)

        def show(rec: dict | None) -> str:
            if rec is None:
                return "—"
            acc = rec.get("test_acc")
            acc = "" if acc is None or acc != acc else f" ({acc:.3f})"
            return f"{rec['test_loss']:.4f}{acc}"

        delta = r["test_loss"] - d["test_loss"]
        gains["no signal" if key[0] in NO_SIGNAL else "separating"].append(delta)
        shrink = "—" if s is None else f"{s['test_loss'] - d['test_loss']:+.4f}"
        vs_plain = "—" if p is None else f"{r['test_loss'] - p['test_loss']:+.4f}"
        at = r.get("settled")
        at = f"step {int(at['step'])}" if at else "no"
        print(
            f"| {key[0]} {key[1]} | {show(p)} | {show(d)} | {show(r)} | {delta:+.4f} | {shrink} "
            f"| {at} | {vs_plain} |"
        )
    for group, deltas in gains.items():
        if deltas:
            better = sum(x < 0 for x in deltas)
            print(
                f"\n{group}: reset − dw mean {statistics.mean(deltas):+.4f}, lower on {better} "
                f"of {len(deltas)}, equal on {sum(x == 0 for x in deltas)}"
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
