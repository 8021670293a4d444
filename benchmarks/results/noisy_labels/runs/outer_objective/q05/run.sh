# ExpectedError(q=0.5) (between the mean loss, q -> 0, and the expected 0-1 error, q = 1): held-out seeds 1-5,
# all four settings, plain / objective="mean_loss" / q = 0.5 back to back in one process per data set; and
# 20 Newsgroups seeds 0-5 (plain and q = 0.5; its mean-loss runs: ../news20*.json, deterministic)
R=benchmarks/results/noisy_labels/runs/outer_objective/q05
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in_mean_loss drop_in --drop-in-kwargs '{"objective": {"q": 0.5}}' --out $R/${DS}.json > $R/${DS}.log 2>&1 &
done
$PY benchmarks/results/noisy_labels/runs/outer_objective/news20.py q=0.5 0 1 2 3 4 5 > $R/news20_q05.log 2>&1 &
wait
