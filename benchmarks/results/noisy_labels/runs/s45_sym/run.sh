# Session 45 (docs/data_weights.md, "Session 45: ..."): candidates against LearnedDataWeights()'s
# symmetric-noise miss, one change each on top of the default, through --drop-in-kwargs.
# The stored recipe: 12 epochs, clip 1, lr 0.05, batch 64, 2000 / 1000 / 5000 examples, 1 thread,
# AVX2 kernels (as ../refresh_s42/avx2, ../s43_margin, ../s44_each). ONE process at a time.
# Usage: bash run.sh screen   (seeds 1-10, both symmetric settings, drop_in only; paired with the
#                              stored default ../refresh_s42/avx2)
#        ARM=<name> bash run.sh confirm   (fresh seeds 16-30, all four settings: the default and
#                              the oracle in one process, plain and the candidate in the next)
#        ARM=<name> bash run.sh news20    (20 Newsgroups seeds 0-8: default and candidate per seed)
#        ARMS=start50 bash run.sh screen   (a screen only, after the confirmation)
#        python $R/table.py   (table.md)
R=benchmarks/results/noisy_labels/runs/s45_sym
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
PY=${PYTHON:-python}
B="$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --threads 1"
declare -A KW=(
  [q075]='{"objective": {"q": 0.75}}'
  [d2x4]='{"batches": {"d2": 4}}'
  [val512]='{"val_batch_size": 512}'
  [classrel]='{"objective": {"class_relative_error": {"q": 0.5}}}'
  [start50]='{"start_step": 50}'
)
case "$1" in
screen)
  for ARM in ${ARMS:-q075 d2x4 val512 classrel}; do
  for DS in mnist fashion; do
    $B --datasets $DS --noise symmetric --seeds 1 2 3 4 5 6 7 8 9 10 --methods drop_in \
      --drop-in-kwargs "${KW[$ARM]}" \
      --out $R/screen/${ARM}_${DS}_symmetric.json > $R/screen/${ARM}_${DS}_symmetric.log 2>&1
  done
  done ;;
confirm)
  for NOISE in symmetric pair; do
  for DS in mnist fashion; do
    $B --datasets $DS --noise $NOISE --seeds $(seq 16 30) --methods drop_in oracle \
      --out $R/confirm/default_${DS}_${NOISE}.json > $R/confirm/default_${DS}_${NOISE}.log 2>&1
    $B --datasets $DS --noise $NOISE --seeds $(seq 16 30) --methods plain drop_in \
      --drop-in-kwargs "${KW[$ARM]}" \
      --out $R/confirm/${ARM}_${DS}_${NOISE}.json > $R/confirm/${ARM}_${DS}_${NOISE}.log 2>&1
  done
  done ;;
news20)
  $PY $R/news20.py $ARM 0 1 2 3 4 5 6 7 8 > $R/news20/${ARM}.log 2>&1 ;;
esac
