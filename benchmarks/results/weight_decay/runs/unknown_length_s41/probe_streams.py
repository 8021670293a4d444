"""The benchmark's settings with the training data as a stream (an IterableDataset yielding a
seeded shuffle each epoch): without ``__len__`` the Trainer cannot know the fit's length even with
``max_epochs`` (the horizon's unknown-length case), against the same stream with ``__len__`` (a
known length); learned per layer with every default. Held-out test loss per seed.

    PYTHONPATH=<tree> python .../probe_streams.py SETTING OUT.json SEED...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_weight_decay as B  # noqa: E402


class Stream(IterableDataset):
    """The tensors' samples in a fresh seeded order each pass; no ``__len__``."""

    def __init__(self, data: TensorDataset, seed: int) -> None:
        self.data, self.seed, self.passes = data, seed, 0

    def __iter__(self):
        order = torch.randperm(
            len(self.data), generator=torch.Generator().manual_seed(self.seed + self.passes)
        )
        self.passes += 1
        return (self.data[i] for i in order.tolist())


class SizedStream(Stream):
    def __len__(self) -> int:
        return len(self.data)


def loader(sized: bool):
    def make(dataset, batch_size=None, shuffle=False, generator=None, **kw):  # noqa: ANN001
        if not shuffle:  # the validation loader stays as it is
            return DataLoader(dataset, batch_size=batch_size, **kw)
        seed = int(generator.initial_seed()) if generator is not None else 0
        return DataLoader((SizedStream if sized else Stream)(dataset, seed), batch_size=batch_size)

    return make


if __name__ == "__main__":
    name, out, seeds = sys.argv[1], Path(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    s = B.SETTINGS[name]
    rows = []
    for seed in seeds:
        roots = {"fashion": B.DEFAULT_FASHION, "news": B.DEFAULT_NEWS}
        data = B.make_data(s, roots.get(s.data, B.DEFAULT_DATA), seed)
        for known in (True, False):
            B.DataLoader = loader(sized=known)
            r = B.train_once(s, data, seed, granularity="per_layer")
            keep = ("test_loss", "test_acc", "optimizer_steps", "cpu_s", "error", "warnings")
            rows.append({"setting": name, "seed": seed, "known": known, **{k: r[k] for k in keep}})
            print(
                json.dumps({k: rows[-1][k] for k in ("seed", "known", "test_loss", "error")}),
                flush=True,
            )
    out.write_text(json.dumps(rows, indent=1, default=str))
