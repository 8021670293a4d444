# screen (seed 0): the drop-in with the outer objective E = 1 − p_y (expected 0-1 error) or GCE q = 0.7 on the
# clean validation data instead of its cross entropy (plain and the default drop-in of this seed:
# runs/natural_sigmoid/screen_seed0, same code path)
R=benchmarks/results/noisy_labels/runs/outer_objective/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for DS in mnist fashion; do
/work/main/.venv/bin/python benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 0 --methods drop_in_val_mae drop_in_val_gce --out $R/$DS.json > $R/$DS.log 2>&1 &
done
wait
