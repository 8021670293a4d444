# screen 2, seed 0, symmetric noise: the default (same code, same load) and SharedLossWeights at lr 0.02 (θ recorded) / 0.005
cd /work/wt-i27-sym
R=benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 --clip 1 --methods drop_in --out $R/${DS}_default.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.02}}' --out $R/${DS}_shared_lr002_b.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.005}}' --out $R/${DS}_shared_lr0005.json
done
