# screen 6 (temporary edit, not in the repository): TiltedLossWeights, w_i = sigmoid(x_i) * exp(theta * min(loss_i, 5)), one shared theta in its own Adam group (lr 0.005; the same with 0.02), from a subclass of SharedLossWeights and a "tilted" key in bench_noisy_labels --drop-in-kwargs
cd /work/wt-i27-sym
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for DS in mnist fashion; do
/work/main/.venv/bin/python benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 6 7 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"tilted": true, "lr": 0.005}}' --out benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0/${DS}_tilted_lr0.005.json
done
