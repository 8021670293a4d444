# PlannedBudget(0.5) against OverheadBudget(0.5) with the outer step TrustRprop (the default since 3fa005a) and the
# callback's per-step work charged (2c6dac5): news_mlp and the Fashion MLP, 9 seeds, both arms at once, one process each.
R=benchmarks/results/weight_decay/runs/planned_trust
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
B='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.'
for S in news_mlp fashion_mlp; do
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --learned-kwargs "${B}OverheadBudget\", \"init_args\": {\"max_overhead\": 0.5}}}" --out $R/${S}_default.json &
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --learned-kwargs "${B}PlannedBudget\", \"init_args\": {\"max_overhead\": 0.5}}}" --out $R/${S}_planned.json &
  wait
done
