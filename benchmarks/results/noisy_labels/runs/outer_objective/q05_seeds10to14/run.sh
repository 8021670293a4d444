# ExpectedError(q=0.5) on fresh seeds (chosen after q = 1 lost on 20 Newsgroups; these seeds were used for
# nothing about q): CNNs seeds 10-14, plain / objective="mean_loss" / q = 0.5 back to back in one process per
# data set; 20 Newsgroups seeds 9-11, plain / mean loss (/ q = 1) then plain / q = 0.5, one after the other
# (3 processes at most: the CPU is shared). news20.py writes its JSON next to itself (news20_seeds91011*.json)
R=benchmarks/results/noisy_labels/runs/outer_objective/q05_seeds10to14
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 10 11 12 13 14 --methods plain drop_in_mean_loss drop_in --drop-in-kwargs '{"objective": {"q": 0.5}}' --out $R/${DS}.json > $R/${DS}.log 2>&1 &
done
$PY benchmarks/results/noisy_labels/runs/outer_objective/news20.py 9 10 11 > $R/news20_91011.log 2>&1 &&
$PY benchmarks/results/noisy_labels/runs/outer_objective/news20.py q=0.5 9 10 11 > $R/news20_91011_q05.log 2>&1 &
wait
