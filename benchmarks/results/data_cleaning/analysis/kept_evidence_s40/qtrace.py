"""probe_drop_in.py with KeptEvidenceError's q* and ESS(q_max)/|V| of every validation batch
recorded: BENCH_DC_OUT=<scratch> python qtrace.py TRACE.json P BUDGET (objective kept_evidence)."""

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks" / "benchopt"))
import probe_drop_in  # noqa: E402

# the recorder of the noisy-label runs' q* trace (a file of the same name: loaded by path)
_spec = importlib.util.spec_from_file_location(
    "noisy_labels_qtrace", REPO / "benchmarks/results/noisy_labels/runs/kept_evidence_s40/qtrace.py"
)
noisy_labels_qtrace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(noisy_labels_qtrace)

record = noisy_labels_qtrace.trace_q()
probe_drop_in.main([sys.argv[2], sys.argv[3], '{"objective": "kept_evidence"}'])
Path(sys.argv[1]).write_text(json.dumps(record))
