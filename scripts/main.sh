#!/usr/bin/env bash
# The main job: learn per-feature weight decay on scikit-learn's bundled digits (no download).
# The demo lives in examples/digits_demo.py (experiment code is not part of the package).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python examples/digits_demo.py "$@"
