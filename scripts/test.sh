#!/usr/bin/env bash
# The test suite: lint, then pytest (pytest's "no tests collected" is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
