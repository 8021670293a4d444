# held-out seeds 1-5, all four settings, the clipped recipe: plain, the drop-in with objective="mean_loss"
# (E = the validation cross entropy, the default until this version) and objective="expected_error"
# (ExpectedError, eq. softerr: E = mean 1 - exp(-loss) = 1 - p_y), back to back in one process per
# data set (1 thread; the two data sets in parallel on the shared 2-core CPU)
R=benchmarks/results/noisy_labels/runs/outer_objective/heldout
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in_mean_loss drop_in_expected_error --out $R/${DS}.json > $R/${DS}.log 2>&1 &
done
wait
