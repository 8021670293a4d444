"""probe_drop_in.py with KeptEvidenceError's q* and ESS(q_max)/|V| of every validation batch
recorded: BENCH_DC_OUT=<scratch> python qtrace.py TRACE.json P BUDGET (objective kept_evidence)."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks" / "benchopt"))
import probe_drop_in  # noqa: E402

from hypertorch_sid.core.sample_weights import KeptEvidenceError  # noqa: E402

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
probe_drop_in.main([sys.argv[2], sys.argv[3], '{"objective": "kept_evidence"}'])
Path(sys.argv[1]).write_text(json.dumps(record))
