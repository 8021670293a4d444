# held-out seeds 1-5, all four settings, clipped recipe: plain, the default drop-in (ForwardMode) and
# directional="forward_difference" (drop_in_fd), back to back in one process per data set (1 thread, shared 2-core CPU)
R=benchmarks/results/noisy_labels/runs/forward_difference
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in drop_in_fd --out $R/${DS}.json
done
# "drop_in" in these files is ForwardMode, the default when they ran (13:39-14:00 UTC, commit c5962cc
# and its follow-ups); forward_difference is the default since, so rerun with
# --methods plain drop_in_fm drop_in_fd
