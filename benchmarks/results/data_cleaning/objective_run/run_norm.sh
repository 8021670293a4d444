#!/bin/bash
# Right after run.sh, on the same machine: SID with the drop-in's own self-normalised training loss
# (normalize=true: Σ ωᵢℓᵢ / Σ ωᵢ + 0.2‖z‖², NOT the benchmark's g), E = the drop-in's default and
# E = the mean loss; 3 seeds, 35 s, p = 0.5 / 0.7 / 0.9. Its parquet files and SID weights are then
# copied next to run.sh's (runs_p*_norm.parquet, sid/) so that one `summarise` reads both.
export BENCH_DC_OUT=$PWD/benchmarks/results/data_cleaning/objective_run/norm
PY=../venv-benchopt/bin/python
$PY benchmarks/bench_data_cleaning.py run --no-cache --timeout 35 --seeds 1 2 3 --peers \
  --sid regime=drop_in,normalize=true regime=drop_in,normalize=true,outer_objective=mean_loss
