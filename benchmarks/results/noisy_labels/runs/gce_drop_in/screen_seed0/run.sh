# screen (seed 0): the drop-in on GCE's per-sample losses (plain, default drop-in and GCE alone are in
# runs/natural_sigmoid/screen_seed0 and runs/clip1_v2 for this seed; GCE rerun here)
R=benchmarks/results/noisy_labels/runs/gce_drop_in/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for DS in mnist fashion; do
/work/main/.venv/bin/python benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods gce drop_in_gce --out $R/$DS.json > $R/$DS.log 2>&1 &
done
wait
