"""Session 55: the per-step cost of ForwardSensitivity's z update against a training step.

A training step (forward, backward, the coupled decay grad += λw, the optimizer's step) of the
benchmark's networks, timed with and without the z update the callback adds (eq. fwdcoupled
through torch's SGD with momentum / Adam), median of repeated blocks, one thread, CPU.
usage (repo root): PYTHONPATH=$PWD OMP_NUM_THREADS=1 python <this file>
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench_weight_decay import make_network  # noqa: E402

from hypertorch_sid.core.forward_sensitivity import ForwardSensitivity, update_rule  # noqa: E402

CASES = {  # name: (network, input size, batch, optimizer)
    "digits_small": ("mlp_digits", 64, 32, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "mnist_cnn": ("cnn", 784, 64, lambda p: torch.optim.Adam(p, lr=1e-3)),
    "mnist_mlp": ("mlp", 784, 64, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
}


def run(name: str, steps: int = 50, blocks: int = 7) -> dict[str, float]:
    kind, d, b, make = CASES[name]
    torch.manual_seed(0)
    net = make_network(kind)
    params = [p for p in net.parameters()]
    opt = make(params)
    x, y = torch.randn(b, d), torch.randint(0, 10, (b,))
    lam, sens = 1e-4, ForwardSensitivity()

    def step(follow: bool) -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        with torch.no_grad():
            if follow:
                rules = [
                    update_rule(opt, opt.param_groups[0], p, lambda p=p: p.grad + lam * p)
                    for p in params
                ]
                sens.step(params, [lam] * len(params), rules)
            torch._foreach_add_([p.grad for p in params], params, alpha=lam)
        opt.step()

    def block(follow: bool) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step(follow)
        return (time.perf_counter() - start) / steps

    for follow in (False, True):  # warm up
        block(follow)
    plain, followed = [], []
    for _ in range(blocks):
        plain.append(block(False))
        followed.append(block(True))
    p, f = statistics.median(plain), statistics.median(followed)
    return {"step_ms": 1e3 * p, "with_z_ms": 1e3 * f, "overhead": f / p - 1}


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(CASES):
        r = run(name)
        print(
            f"{name}: training step {r['step_ms']:.3f} ms, with the z update "
            f"{r['with_z_ms']:.3f} ms: +{100 * r['overhead']:.1f} %"
        )
