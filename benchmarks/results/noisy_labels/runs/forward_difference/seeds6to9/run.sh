# more held-out seeds (6-9) for the forward-difference default against ForwardMode, all four settings, clipped recipe,
# back to back in one process per data set (1 thread; the two data sets in parallel on the 2-core CPU)
R=benchmarks/results/noisy_labels/runs/forward_difference/seeds6to9
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 6 7 8 9 --methods plain drop_in_fm drop_in_fd --out $R/${DS}.json &
done
wait
