#!/usr/bin/env bash
# The main job: learn per-feature weight decay on scikit-learn's bundled digits (no download).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python -m hypertorch_sid "$@"
