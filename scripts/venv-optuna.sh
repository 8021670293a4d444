#!/usr/bin/env bash
# A venv for the benchmark's Optuna trials (bench_weight_decay.py --methods optuna): Optuna is an
# optional dependency the project's venv does not hold. It reuses the project venv's packages
# (torch, lightning, ...) through a .pth file and adds optuna on top.
#   scripts/venv-optuna.sh [VENV] [PROJECT_VENV]     (defaults: /work/venv-optuna, /work/main/.venv)
set -euo pipefail
VENV=${1:-/work/venv-optuna}
BASE=${2:-/work/main/.venv}
PY=$("$BASE/bin/python" -c 'import sys; print(f"python{sys.version_info.major}.{sys.version_info.minor}")')
SITE=$("$BASE/bin/python" -c 'import site; print(site.getsitepackages()[0])')
"$BASE/bin/python" -m venv "$VENV"
echo "$SITE" > "$VENV/lib/$PY/site-packages/project_venv.pth"
"$VENV/bin/python" -m pip install --quiet optuna
"$VENV/bin/python" -c 'import optuna, torch; print("optuna", optuna.__version__, "torch", torch.__version__)'
