# held-out seeds 1-5, four settings: ForwardDifference (the default) with a hyper step every 30 steps
# instead of 40 (the saved compute spent on v), to pair by seed with ../mnist.json, ../fashion.json
R=benchmarks/results/noisy_labels/runs/forward_difference/every30_heldout
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in --drop-in-kwargs '{"every_n_steps": 30}' --out $R/${DS}.json
done
