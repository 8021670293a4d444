# screen, seed 0 only (held out: seeds 1-5), clipped recipe, symmetric noise only
cd /work/wt-i27-sym
R=benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.02}}' --out $R/${DS}_shared_lr002.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.1}}' --out $R/${DS}_shared_lr01.json
done
