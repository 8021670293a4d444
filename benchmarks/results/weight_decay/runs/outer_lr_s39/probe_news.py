"""Why is the learned default worse than no weight decay on news_mlp though its λ ends at ~1e-9?
One arm, a few seeds, held-out test loss (bench_weight_decay.py's news_mlp, one training each):

    python probe_news.py 0 0 1 2         # no weight decay
    python probe_news.py until100 0 1 2  # λ = 1e-4 (the user's λ₀) for the first 100 steps, then 0
    python probe_news.py init1e-6 0 1 2  # the learned default started at 1e-6 instead of 1e-4

Run from the repository root; writes probe_news_<arm>.json next to this file.
"""

import json
import sys
from pathlib import Path

import pytorch_lightning as pl

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
import bench_weight_decay as bench  # noqa: E402


class DecayUntil(pl.Callback):
    """Coupled decay λ in the optimizer's param groups for the first ``until`` steps, then 0."""

    def __init__(self, lam: float, until: int) -> None:
        self.lam, self.until = lam, until

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        wd = self.lam if trainer.global_step < self.until else 0.0
        for group in trainer.optimizers[0].param_groups:
            group["weight_decay"] = wd


def train(arm: str, setting: bench.Setting, data: bench.Data, seed: int) -> dict:
    if arm.startswith("init"):
        return bench.train_once(
            setting, data, seed, granularity="per_layer", learned_init=float(arm[4:])
        )
    if not arm.startswith("until"):
        return bench.train_once(setting, data, seed, float(arm))
    plain_init = pl.Trainer.__init__
    schedule = DecayUntil(1e-4, int(arm[5:]))

    def with_schedule(self, *args, callbacks=None, **kwargs):
        plain_init(self, *args, callbacks=[schedule], **kwargs)

    pl.Trainer.__init__ = with_schedule
    try:
        return bench.train_once(setting, data, seed, 0.0)
    finally:
        pl.Trainer.__init__ = plain_init


def main() -> None:
    arm, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
    setting = bench.SETTINGS["news_mlp"]
    out = {}
    for seed in seeds:
        rec = train(arm, setting, bench.make_data(setting, Path("../shared/data"), seed), seed)
        out[seed] = (rec["test_loss"], rec.get("lambda_summary"), rec.get("hyper_steps"))
        print(arm, seed, out[seed], flush=True)
    (here / f"probe_news_{arm}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
