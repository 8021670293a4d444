# held-out seeds 1-5, all four settings, clipped recipe: LearnedDataWeights(parameterization=SharedLossWeights(lr=0.005)) (hinge basis)
cd /work/wt-i27-sym
H=benchmarks/results/noisy_labels/runs/shared_loss/heldout
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.005}}' --out $H/${DS}_shared.json
done
