"""Compare the before / after records field by field, but for the clock (cpu_s, wall_s) and the
command: ``python compare.py before after``."""

import json
import sys
from pathlib import Path

CLOCK = {"cpu_s", "wall_s", "command"}


def records(path: Path) -> list[dict]:
    kept = json.loads(path.read_text())
    return kept if isinstance(kept, list) else kept["records"]


def main(before: Path, after: Path) -> bool:
    same = True
    for f in sorted(before.glob("*.json")):
        a, b = records(f), records(after / f.name)
        if len(a) != len(b):
            print(f.name, "record counts differ", len(a), len(b))
            same = False
            continue
        for ra, rb in zip(a, b, strict=True):
            ka, kb = set(ra) - CLOCK, set(rb) - CLOCK
            diff = [k for k in ka & kb if json.dumps(ra[k]) != json.dumps(rb[k])]  # NaN == NaN
            extra = sorted(ka ^ kb)
            label = f"{f.name} {ra.get('recipe')} {ra.get('arm')} {ra.get('seed')}"
            if diff or extra:
                same = False
                print(label, "differs:", diff, "keys only in one:", extra)
            else:
                print(label, f"identical ({len(ka)} fields; test_loss {ra.get('test_loss')})")
    print("ALL IDENTICAL" if same else "DIFFERENCES")
    return same


if __name__ == "__main__":
    sys.exit(0 if main(Path(sys.argv[1]), Path(sys.argv[2])) else 1)
