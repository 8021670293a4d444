# PlannedBudget against the default budget on 18 more seeds (9-26) of the two MLP settings where it moved the means
# up (+0.0072 / +0.0112 on seeds 0-8): both arms at once, one process each on the 2-core CPU (same load for both).
R=benchmarks/results/weight_decay/runs/planned_more
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
SEEDS=$(seq 9 26)
for S in mnist_mlp fashion_mlp; do
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds $SEEDS --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --out $R/${S}_default.json &
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds $SEEDS --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --learned-kwargs '{"max_overhead": {"class_path": "hypertorch_sid.core.budget.PlannedBudget", "init_args": {"max_overhead": 0.5}}}' \
    --out $R/${S}_planned.json &
  wait
done
