# four more held-out seeds (6-9), all four settings: plain, oracle, objective="mean_loss" and
# objective="expected_error" back to back in one process per data set (1 thread; the two data sets in
# parallel on the shared 2-core CPU)
R=benchmarks/results/noisy_labels/runs/outer_objective/seeds6to9
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 6 7 8 9 --methods plain oracle drop_in_mean_loss drop_in_expected_error --out $R/${DS}.json > $R/${DS}.log 2>&1 &
done
wait
