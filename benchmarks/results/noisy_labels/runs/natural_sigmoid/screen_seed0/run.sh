# the screen (seed 0), all four settings: plain, the default drop-in, NaturalSigmoidWeights
R=benchmarks/results/noisy_labels/runs/natural_sigmoid/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for DS in mnist fashion; do
/work/main/.venv/bin/python benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods plain drop_in drop_in_natural --out $R/$DS.json &
done
wait
