# seed 0 (the choice seed), four settings: the saved compute spent on more hyper steps. Plain, the old
# default (ForwardMode, every 40), the new default (ForwardDifference, every 40), then FD every 20 / 30
R=benchmarks/results/noisy_labels/runs/forward_difference/every20_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods plain drop_in_fm drop_in --out $R/${DS}_defaults.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods drop_in --drop-in-kwargs '{"every_n_steps": 20}' --out $R/${DS}_every20.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods drop_in --drop-in-kwargs '{"every_n_steps": 30}' --out $R/${DS}_every30.json
done
