"""Session 61: two_opt_manual's own recipe (λ = 5e-4 on every layer, held: the drop-in with its
outer step skipped) replayed in plain PyTorch from its state at optimizer steps 20, 200 and 300
to the fit's end with every slot's λ times e^f, f in {−0.6, −0.3, −0.1, 0.1, 0.3, 0.6, 1, −2.3}:
the final validation and test losses against f = 0 (the own recipe itself; the replay ends at
its test loss). usage (repository root):
python benchmarks/results/user_recipes/s61_two_opt/all_slots.py 3 4 5 6 7 8
(writes all_slots.json beside it)"""

import copy
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import diag_two_opt_s61 as D  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, trainer  # noqa: E402

FACTORS = (0.0, -0.6, -0.3, -0.1, 0.1, 0.3, 0.6, 1.0, -2.3)
OUT = Path(__file__).with_name("all_slots.json")


def main() -> None:
    torch.set_num_threads(1)
    out = []
    for seed in [int(s) for s in sys.argv[1:]] or [3, 4, 5, 6, 7, 8]:
        tr, va, te = images(Path("../shared/data"), "fashion-mnist", seed, 2000, 300, 2000)
        train, val, test = tensors(tr), tensors(va), tensors(te)
        torch.manual_seed(seed)
        model = D.model_of("sgd_adam")
        module0 = copy.deepcopy(model)
        batches = D.Batches()
        loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
        cb = D.Recorded(5e-4, frozen=True, batches=batches, training_loss=loss,
                        max_overhead=None)  # fmt: skip
        trainer([batches, cb], 6).fit(
            model, recipe_loader(train, None, 64, False, True),
            recipe_loader(val, None, 64, False, False),
        )  # fmt: skip
        per_epoch = len(batches.seen) // 6
        for r in (cb.records[0], cb.records[9], cb.records[14]):  # steps 20, 200, 300
            module0.load_state_dict(r["module"])
            lam = dict(zip(r["slots"], r["lam"]))
            row = {"seed": seed, "step": r["step"]}
            for f in FACTORS:
                moved = {k: v * math.exp(f) for k, v in lam.items()}
                _, v_end, t_end = D.replay(
                    "sgd_adam", module0, r["optimizers"], batches.seen, r["batch"], moved,
                    val.tensors, per_epoch, r["batch"], test.tensors,
                )  # fmt: skip
                row[str(f)] = {"val_loss": v_end, "test_loss": t_end}
            print(row, flush=True)
            out.append(row)
            OUT.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
