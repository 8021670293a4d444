"""A benchmark setting trained from a stream: the training loader reads an ``IterableDataset``
without ``len`` (the samples shuffled per epoch by a seeded generator), so the trainer cannot know
the fit's length. Known arm: ``max_steps`` = the setting's epochs × batches per epoch (what a user
of a stream gives); unknown arm: ``max_epochs=-1`` and a callback that stops the fit after the
setting's epochs. Learned per layer with every default (its budget included). Held-out test loss
per seed.

    PYTHONPATH=<tree> python .../probe_stream.py SETTING OUT.json SEED...
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "unknown_length_s40"))
from probe_settings import B, StopAfterEpochs  # noqa: E402


class Stream(IterableDataset):
    """The dataset's samples in a fresh seeded order each pass; no ``__len__``."""

    def __init__(self, dataset, generator: torch.Generator) -> None:  # noqa: ANN001
        self.dataset, self.generator = dataset, generator

    def __iter__(self):  # noqa: ANN204
        for i in torch.randperm(len(self.dataset), generator=self.generator).tolist():
            yield self.dataset[i]


def stream_loader(dataset, batch_size, shuffle=False, generator=None, **kw):  # noqa: ANN001, ANN201
    if not shuffle:
        return DataLoader(dataset, batch_size=batch_size, **kw)
    return DataLoader(Stream(dataset, generator), batch_size=batch_size, **kw)


_init = pl.Trainer.__init__


def arm(known: bool, steps: int):  # noqa: ANN201
    def init(self, *args, max_epochs=None, callbacks=None, **kw):  # noqa: ANN001
        if known:
            _init(self, *args, max_epochs=-1, max_steps=steps, callbacks=callbacks, **kw)
        else:
            stop = StopAfterEpochs(max_epochs)
            _init(self, *args, max_epochs=-1, callbacks=[*(callbacks or []), stop], **kw)

    return init


if __name__ == "__main__":
    name, out, seeds = sys.argv[1], Path(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    s = B.SETTINGS[name]
    B.DataLoader = stream_loader
    rows = []
    for seed in seeds:
        roots = {"fashion": B.DEFAULT_FASHION, "news": B.DEFAULT_NEWS}
        data = B.make_data(s, roots.get(s.data, B.DEFAULT_DATA), seed)
        steps = s.epochs * math.ceil(len(data.y_train) / s.batch_size)
        for known in (True, False):
            pl.Trainer.__init__ = arm(known, steps)
            r = B.train_once(s, data, seed, granularity="per_layer")
            keep = ("test_loss", "test_acc", "optimizer_steps", "cpu_s", "error", "warnings")
            row = {"setting": name, "seed": seed, "known": known}
            rows.append(row | {k: r.get(k) for k in keep})
            shown = ("seed", "known", "test_loss", "optimizer_steps", "error")
            print(json.dumps({k: rows[-1][k] for k in shown}), flush=True)
    pl.Trainer.__init__ = _init
    out.write_text(json.dumps(rows, indent=1, default=str))
