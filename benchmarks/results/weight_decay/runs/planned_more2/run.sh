# PlannedBudget(0.5) against the default budget (OverheadBudget(0.5)), both arms at once, one process each on the 2-core
# CPU (same load for both): the Fashion MLP on 27 more seeds (27-53) and digits_mlp on 9 seeds (0-8).
# Run on main at 72865ef (the default as found at the start of this stop: per layer, OverheadBudget(0.5),
# CurrentWeights(), the outer step of that commit), from the repository root.
R=benchmarks/results/weight_decay/runs/planned_more2
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
run() {  # setting, seeds...
  S=$1; shift
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds "$@" --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --out $R/${S}_default.json &
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds "$@" --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --learned-kwargs '{"max_overhead": {"class_path": "hypertorch_sid.core.budget.PlannedBudget", "init_args": {"max_overhead": 0.5}}}' \
    --out $R/${S}_planned.json &
  wait
}
run fashion_mlp $(seq 27 53)
run digits_mlp $(seq 0 8)
