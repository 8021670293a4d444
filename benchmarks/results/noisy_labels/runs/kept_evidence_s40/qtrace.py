"""bench_noisy_labels.py with KeptEvidenceError's q* (and ESS(q_max)/|V|, mean p_y) of every
validation batch recorded: python qtrace.py TRACE.json <bench_noisy_labels arguments>."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
import bench_noisy_labels  # noqa: E402

from hypertorch_sid.core.objectives import KeptEvidenceError  # noqa: E402


def trace_q() -> list[tuple[float, float, float]]:
    """Record (q*, ESS(q_max)/|V|, mean p_y) of every validation batch KeptEvidenceError sees
    from now on, in the list returned (also used by data_cleaning/analysis/kept_evidence_s40)."""
    record: list[tuple[float, float, float]] = []
    choose_q = KeptEvidenceError.choose_q

    def recorded_choose_q(self: KeptEvidenceError, losses: torch.Tensor) -> torch.Tensor:
        q = choose_q(self, losses)
        ell = losses.detach().double()
        w = torch.exp(-self.q_max * ell)
        ess = float(w.sum() ** 2 / (w * w).sum() / ell.numel())
        record.append((float(q), ess, float(torch.exp(-ell).mean())))
        return q

    KeptEvidenceError.choose_q = recorded_choose_q
    return record


if __name__ == "__main__":
    record = trace_q()
    bench_noisy_labels.main(sys.argv[2:])
    Path(sys.argv[1]).write_text(json.dumps(record))
