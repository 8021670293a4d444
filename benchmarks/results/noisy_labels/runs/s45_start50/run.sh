# Session 45, start45: start_step=50 (hyper steps and weight learning from optimizer step 50, not
# 100) confirmed on fresh seeds against LearnedDataWeights()'s default, under a rule written
# before this run (docs/data_weights.md, "start_step=50 on fresh seeds (session 45)").
# The recipe and conventions of ../s45_sym: 12 epochs, clip 1, lr 0.05, batch 64,
# 2000 / 1000 / 5000 examples, 1 thread, AVX2 kernels. ONE process at a time.
# The default's runs (and the oracle) are ../s45_sym/confirm/default_*.json and the default of
# ../s45_sym/news20/q075.json; they are paired by seed, not rerun (one seed of each is rerun here
# as a bit-for-bit check).
# Usage (repository root):
#   bash run.sh check      (the default, MNIST symmetric seed 16 and 20 Newsgroups seed 0)
#   bash run.sh confirm    (seeds 16-30, four settings: plain and start50 in one process)
#   bash run.sh news20     (20 Newsgroups seeds 0-8, start50)
#   bash run.sh imbalance  (the imbalanced example, seeds 0-4: per_class and per sample,
#                           the default and start50, one process each)
#   python $R/table.py     (table.md)
R=benchmarks/results/noisy_labels/runs/s45_start50
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
PY=${PYTHON:-python}
B="$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --threads 1"
KW='{"start_step": 50}'
case "$1" in
check)
  $B --datasets mnist --noise symmetric --seeds 16 --methods drop_in \
    --out $R/confirm/check_default_mnist_symmetric16.json \
    > $R/confirm/check_default_mnist_symmetric16.log 2>&1
  $PY $R/news20.py default 0 > $R/news20/default.log 2>&1 ;;
confirm)
  for NOISE in symmetric pair; do
  for DS in mnist fashion; do
    $B --datasets $DS --noise $NOISE --seeds $(seq 16 30) --methods plain drop_in \
      --drop-in-kwargs "$KW" \
      --out $R/confirm/start50_${DS}_${NOISE}.json > $R/confirm/start50_${DS}_${NOISE}.log 2>&1
  done
  done ;;
news20)
  $PY $R/news20.py start50 0 1 2 3 4 5 6 7 8 > $R/news20/start50.log 2>&1 ;;
imbalance)
  I="$PY benchmarks/bench_noisy_labels.py --noise --imbalance --imbalance-methods per_class drop_in
     --epochs 12 --seeds 0 1 2 3 4 --lr 0.02 --clip 0 --threads 1"
  $I --out $R/imbalance/default.json > $R/imbalance/default.log 2>&1
  $I --drop-in-kwargs "$KW" --out $R/imbalance/start50.json > $R/imbalance/start50.log 2>&1 ;;
esac
