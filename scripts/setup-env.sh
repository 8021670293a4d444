#!/usr/bin/env bash
# Create .venv (if missing) and install hypertorch-sid with its dev/examples/plots/docs extras
# (pytest + pytest-xdist, ruff, build/twine, matplotlib, MkDocs). The bench extra (the peers the
# benchmarks compare against) is installed on request: .venv/bin/pip install -e ".[bench]".
# torch and torchvision are pinned to builds this machine kind installs from local disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import hypertorch_sid, torch, pytorch_lightning, sklearn, pytest, xdist, hypothesis, matplotlib, mkdocs, mkdocstrings_handlers.python" 2>/dev/null \
   || [ setup.cfg -nt .venv/.installed ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/pip install -q "torch==2.14.1" "torchvision==0.29.1"
  .venv/bin/pip install -q -e ".[dev,examples,plots,docs]"
  touch .venv/.installed
fi
