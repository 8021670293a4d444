#!/bin/bash
# 2026-11-27 ~00:30 UTC (rerun of objective_run, whose SID weight files were overwritten): SID with the drop-in's current defaults (outer objective E = ExpectedError(q=0.5))
# and with E = the benchmark's own f (mean validation CE), beside SRBA, SOBA, AmIGO (their best params),
# 3 seeds, 35 s, p = 0.5 / 0.7 / 0.9, one benchopt run per p. Run from the repository root.
export BENCH_DC_OUT=$PWD/benchmarks/results/data_cleaning/objective_run_s41
PY=../venv-benchopt/bin/python
$PY benchmarks/bench_data_cleaning.py run --no-cache --timeout 35 --seeds 1 2 3 --peers SRBA SOBA AmIGO \
  --sid regime=drop_in regime=drop_in,outer_objective=mean_loss
