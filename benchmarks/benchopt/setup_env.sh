#!/usr/bin/env bash
# Build the CPU-only environment for the benchopt bilevel benchmark (issue 27, part 4).
#   bash benchmarks/benchopt/setup_env.sh [VENV_DIR]      (default: venv-benchopt beside the repository)
# Installs benchopt, jax, jaxlib (CPU) and the benchmark's requirements (scikit-learn) from PyPI.
# torch and hypertorch_sid are NOT reinstalled: a .pth file appends the project venv's site-packages
# (torch CPU) and the repository root, so the SID solver imports the same library as the tests.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${1:-$REPO_ROOT/../venv-benchopt}
PROJECT_VENV=${PROJECT_VENV:-$REPO_ROOT/.venv}
PY=${PYTHON:-python3.11}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "benchopt==1.10.0" "jax[cpu]" scikit-learn matplotlib pandas pyyaml
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PROJ_SITE=$("$PROJECT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n%s\n' "$REPO_ROOT" "$PROJ_SITE" > "$SITE/zz_hypertorch_sid.pth"
"$VENV/bin/python" - <<'PY'
import benchopt, jax, sklearn, torch, hypertorch_sid
print("benchopt", benchopt.__version__, "jax", jax.__version__, "torch", torch.__version__,
      "hypertorch_sid from", hypertorch_sid.__file__)
PY
