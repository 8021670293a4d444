"""Test accuracy (%) per seed and the paired default − mean loss, from the run.sh JSONs."""

import json
import statistics
from pathlib import Path

here = Path(__file__).parent
for path in sorted(here.glob("*_r07.json")):
    for name, setting in json.loads(path.read_text())["settings"].items():
        acc = {m: [100 * r["test_acc"] for r in runs] for m, runs in setting["runs"].items()}
        print(name)
        for m, v in acc.items():
            print(f"  {m:18s}", " ".join(f"{x:5.1f}" for x in v), f"mean {statistics.mean(v):.2f}")
        d = [a - b for a, b in zip(acc["drop_in"], acc["drop_in_mean_loss"])]
        se = statistics.stdev(d) / len(d) ** 0.5
        print(f"  default − mean loss: {statistics.mean(d):+.2f} ± {se:.2f}")
