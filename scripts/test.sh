#!/usr/bin/env bash
# The test suite: lint and format check, then every test with pytest on all cores (pytest-xdist; PYTEST_WORKERS=0
# runs in one process). Extra arguments go to pytest, e.g. `bash scripts/test.sh --durations=10`.
# pytest's "no tests collected" is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-auto}" "$@"
