"""The records of ``run.sh`` side by side: per seed, the own recipe and the decay arm before and
after (test loss, accuracy, the learned logit scale or task log-variances, the λ of the tensors no
layer owns), then the paired differences (mean ± s.e., seeds with a positive difference)."""

import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
RECIPES = ("cosine_head", "kendall_mt")
LAYERS = ("trunk", "fine", "coarse", "shared")  # λ of the modules: not printed


def records(*files: str) -> list[dict]:
    return [r for f in files for r in json.loads((HERE / f).read_text())]


def by_seed(recipe: str, arm: str, *files: str) -> dict[int, dict]:
    return {r["seed"]: r for r in records(*files) if r["recipe"] == recipe and r["arm"] == arm}


def learned(r: dict) -> str:
    kept = "scale" if "scale" in r else "log_vars"
    value = f"{r[kept]:.2f}" if kept == "scale" else str([round(x, 3) for x in r[kept]])
    lam = {n: f"{x:.2g}" for n, x in r["lam"].items() if not n.startswith(LAYERS)}
    ran = r["due_ran"]["LearnedWeightDecay"]
    return f"{r['test_loss']:.4f} {r['test_acc']:.4f} {kept}={value} ran={ran} {lam}"


def paired(name: str, d: list[float]) -> None:
    se = st.stdev(d) / len(d) ** 0.5
    print(f"  {name}: {st.mean(d):+.4f} ± {se:.4f} ({sum(v > 0 for v in d)}/{len(d)} > 0)")


def main() -> None:
    arms = {
        "before": ("before.json",),
        "after": ("after.json",),
        "before_det": ("before_det.json", "before_det2.json"),
        "after_det": ("after_det.json", "after_det2.json"),
        "after_det_weights": ("after_det_weights.json",),
    }
    for recipe in RECIPES:
        own = by_seed(recipe, "own", "before.json", "before_det2.json")
        runs = {k: by_seed(recipe, "decay", *files) for k, files in arms.items()}
        print("==", recipe)
        for s in sorted(own):
            print(f"seed {s} own {own[s]['test_loss']:.4f} {own[s]['test_acc']:.4f}")
            for k, v in runs.items():
                if s in v:
                    print(f"   {k:18s} {learned(v[s])}")
        for k, v in runs.items():
            seeds = sorted(set(v) & set(own))
            if len(seeds) < 2:
                continue
            print(f"{k} − own, seeds {seeds[0]}–{seeds[-1]}:")
            paired("test loss", [v[s]["test_loss"] - own[s]["test_loss"] for s in seeds])
            paired("accuracy, pts", [100 * (v[s]["test_acc"] - own[s]["test_acc"]) for s in seeds])
        for new, old in (("after", "before"), ("after_det", "before_det")):
            seeds = sorted(set(runs[new]) & set(runs[old]))
            a, b = runs[new], runs[old]
            print(f"{new} − {old}, seeds {seeds[0]}–{seeds[-1]}:")
            paired("test loss", [a[s]["test_loss"] - b[s]["test_loss"] for s in seeds])
            paired("accuracy, pts", [100 * (a[s]["test_acc"] - b[s]["test_acc"]) for s in seeds])
            if recipe == "cosine_head":
                paired("logit scale", [a[s]["scale"] - b[s]["scale"] for s in seeds])
                for name, z in (("own", own), (old, b), (new, a)):
                    print(f"  mean scale {name}: {st.mean(z[s]['scale'] for s in seeds):.2f}")
        if recipe == "cosine_head":
            w, a = runs["after_det_weights"], runs["after_det"]
            print("after_det_weights − after_det:")
            paired("test loss", [w[s]["test_loss"] - a[s]["test_loss"] for s in sorted(w)])
            print(f"  mean scale: {st.mean(w[s]['scale'] for s in w):.2f}")


if __name__ == "__main__":
    main()
