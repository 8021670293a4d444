# PlannedBudget(0.5) against the default budget (OverheadBudget(0.5)) on news_mlp, 9 seeds, both arms at once, one
# process each on the 2-core CPU, with the callback's per-step work charged (this version).
R=benchmarks/results/weight_decay/runs/planned_news
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
S=news_mlp
$PY benchmarks/bench_weight_decay.py --settings $S --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer --optuna-trials 0 \
  --threads 1 --learned-kwargs '{"max_overhead": {"class_path": "hypertorch_sid.core.budget.OverheadBudget", "init_args": {"max_overhead": 0.5}}}' \
  --out $R/${S}_default.json &
$PY benchmarks/bench_weight_decay.py --settings $S --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer --optuna-trials 0 \
  --threads 1 --learned-kwargs '{"max_overhead": {"class_path": "hypertorch_sid.core.budget.PlannedBudget", "init_args": {"max_overhead": 0.5}}}' \
  --out $R/${S}_planned.json &
wait
