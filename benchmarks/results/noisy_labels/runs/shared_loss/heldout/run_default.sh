# held-out seeds 1-5, all four settings, clipped recipe: plain and the current default drop-in (after c582021) in one process per data set
cd /work/wt-i27-sym
H=benchmarks/results/noisy_labels/runs/shared_loss/heldout
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in --out $H/${DS}_default.json
done
