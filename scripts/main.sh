#!/usr/bin/env bash
# The main job: an MLP on scikit-learn's bundled digits (no download) trained with Lightning three
# ways — no weight decay, a grid of five, LearnedWeightDecay() — a table, a JSON and two figures in
# results/tmp/main_job/ (the committed run the README shows is results/lightning_digits*). The script is examples/lightning_digits.py (experiment code is not
# part of the package); the convex per-pixel demo is examples/digits_demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python examples/lightning_digits.py "$@"
