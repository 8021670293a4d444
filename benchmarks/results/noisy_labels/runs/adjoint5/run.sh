# Issue 27: LearnedDataWeights(adjoint_steps=5) (k = 5 adjoint steps per hyper step, was 3), the winner of the
# symmetric-noise screen (../sym_screen), on seeds 1-5 (all four settings; seeds 1-2 of symmetric noise chose it)
# and fresh seeds 6-10, plain in the same process for the CPU ratio; 20 Newsgroups seeds 0-5 (plain, default,
# adjoint_steps=5 back to back); the imbalance example seeds 0-4. The default's accuracies on these seeds are the
# stored runs ../outer_objective/q05{,_seeds6to9,_seeds10to14} and ../imbalance_q05 (same code path: seeds 1-2
# of the screen's base.json reproduce them to the digit).
R=benchmarks/results/noisy_labels/runs/adjoint5
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
K='{"adjoint_steps": 5}'
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 1 2 3 4 5 --methods plain drop_in --drop-in-kwargs "$K" --out $R/${DS}_seeds1to5.json > $R/${DS}_seeds1to5.log 2>&1 &
$PY benchmarks/bench_noisy_labels.py --datasets $DS --epochs 12 --clip 1 --seeds 6 7 8 9 10 --methods plain drop_in --drop-in-kwargs "$K" --out $R/${DS}_seeds6to10.json > $R/${DS}_seeds6to10.log 2>&1 &
done
$PY benchmarks/results/noisy_labels/runs/sym_screen/news20.py k=5 0 1 2 3 4 5 > $R/news20.log 2>&1 &  # writes ../sym_screen/news20_k5_seeds0_1_2_3_4_5.json; stopped after seed 0 once k = 5 failed
$PY benchmarks/bench_noisy_labels.py --noise --imbalance --epochs 12 --seeds 0 1 2 3 4 --lr 0.02 --clip 0 --imbalance-methods per_class drop_in --drop-in-kwargs "$K" --out $R/imbalance.json > $R/imbalance.log 2>&1 &
wait
# the oracle of seed 10 (not stored; seeds 1-9: ../clip1_v2, ../outer_objective/seeds6to9)
$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --seeds 10 --methods oracle --out $R/oracle_seed10.json > $R/oracle_seed10.log 2>&1
# after k = 5 failed on fresh seeds (Fashion symmetric 6-10: -1.07 +- 0.86): every_n_steps=30 (the screen's
# other option under 2x) on symmetric noise, seeds 3-10 (seeds 1-2: ../sym_screen/every30.json); the 20 Newsgroups
# and imbalance runs above were stopped/kept as they stood (news20: seed 0 only)
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --clip 1 --seeds 3 4 5 6 7 8 9 10 --methods drop_in --drop-in-kwargs '{"every_n_steps": 30}' --out $R/every30_${DS}_seeds3to10.json > $R/every30_${DS}_seeds3to10.log 2>&1 &
done
wait
