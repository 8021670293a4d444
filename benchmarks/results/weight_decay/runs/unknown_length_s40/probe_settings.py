"""The benchmark's settings (bench_weight_decay.py) trained as a fit of unknown length: the
Trainer gets ``max_epochs=-1`` and a callback that stops it after the setting's epochs (as early
stopping would), against the same fit with ``max_epochs`` known; learned per layer with every
default (its budget included). Held-out test loss per seed.

    PYTHONPATH=<tree> python .../probe_settings.py SETTING OUT.json SEED...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_weight_decay as B  # noqa: E402


class StopAfterEpochs(pl.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, *args) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


_init = pl.Trainer.__init__


def unknown_length(self, *args, max_epochs=None, callbacks=None, **kw):  # noqa: ANN001
    _init(self, *args, max_epochs=-1, callbacks=[*(callbacks or []), StopAfterEpochs(max_epochs)],
          **kw)  # fmt: skip


if __name__ == "__main__":
    name, out, seeds = sys.argv[1], Path(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    s = B.SETTINGS[name]
    rows = []
    for seed in seeds:
        roots = {"fashion": B.DEFAULT_FASHION, "news": B.DEFAULT_NEWS}
        data = B.make_data(s, roots.get(s.data, B.DEFAULT_DATA), seed)
        for known in (True, False):
            pl.Trainer.__init__ = _init if known else unknown_length
            r = B.train_once(s, data, seed, granularity="per_layer")
            keep = ("test_loss", "test_acc", "optimizer_steps", "cpu_s", "error", "warnings")
            rows.append({"setting": name, "seed": seed, "known": known, **{k: r[k] for k in keep}})
            print(json.dumps({k: rows[-1][k] for k in ("seed", "known", "test_loss")}), flush=True)
    pl.Trainer.__init__ = _init
    out.write_text(json.dumps(rows, indent=1, default=str))
