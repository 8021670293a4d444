# Session 43 (docs/data_weights.md, "Session 43: outer objectives against the kept look-alike corruptions"): the
# drop-in with E = MarginError (eq. marginerr, tau = 1 logit), AdaptiveMarginError (tau by Silverman's rule per
# validation batch, eq. marginbw) and ClassRelativeError (eq. classrel, step 2) against the default
# (ExpectedError(q=0.5)), MNIST / Fashion-MNIST symmetric 40 %, seeds 1-2, paired by seed with the stored default runs of
# ../refresh_s42/avx2 (the same AVX2 kernels; steps 0 and 3 reproduce them bit for bit with this session's code).
# The stored recipe: 12 epochs, clip 1, lr 0.05, batch 64, 2000 / 1000 / 5000 examples, 1 thread. ONE process at a time.
# (The folder is named after the first candidate; it holds all three.) Usage: bash run.sh (all) or STEP=0|1|2|3 bash run.sh
# Table: python benchmarks/results/noisy_labels/runs/s43_margin/table.py (table.md);
# class pairs (seed 1): python benchmarks/results/noisy_labels/runs/s43_margin/pairs.py (pairs.txt)
R=benchmarks/results/noisy_labels/runs/s43_margin
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
PY=/work/main/.venv/bin/python
B="$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --threads 1"
STEP=${STEP:-all}
# 0. the default reproduces the stored run (MNIST symmetric seed 1: plain 0.7276, drop-in 0.8660 in ../refresh_s42/avx2)
if [ $STEP = all ] || [ $STEP = 0 ]; then
$B --datasets mnist --noise symmetric --seeds 1 --methods plain drop_in --out $R/repro_default_mnist_sym_seed1.json > $R/repro_default_mnist_sym_seed1.log 2>&1
fi
# 1. screen: seeds 1-2, symmetric 40 %, both data sets, plain in the same process (for CPU x plain)
if [ $STEP = all ] || [ $STEP = 1 ]; then
for ARM in margin_error adaptive_margin_error; do
for DS in mnist fashion; do
$B --datasets $DS --noise symmetric --seeds 1 2 --methods plain drop_in --drop-in-kwargs "{\"objective\": \"$ARM\"}" --out $R/screen_${ARM}_${DS}.json > $R/screen_${ARM}_${DS}.log 2>&1
done
done
fi
# 2. the third candidate (written after 1 had lost): E = ClassRelativeError (eq. classrel: the mean over classes of
#    log of each class's expected error), the same screen
if [ $STEP = all ] || [ $STEP = 2 ]; then
for DS in mnist fashion; do
$B --datasets $DS --noise symmetric --seeds 1 2 --methods plain drop_in --drop-in-kwargs '{"objective": "class_relative_error"}' --out $R/screen_class_relative_error_${DS}.json > $R/screen_class_relative_error_${DS}.log 2>&1
done
fi
# 3. the default (no --drop-in-kwargs) rerun on seeds 1-2 with this session's final code: bit for bit the stored runs
#    (test accuracy), and its final weights for the table's mechanism columns (../refresh_s42 stores none)
if [ $STEP = all ] || [ $STEP = 3 ]; then
for DS in mnist fashion; do
$B --datasets $DS --noise symmetric --seeds 1 2 --methods plain drop_in --out $R/screen_default_${DS}.json > $R/screen_default_${DS}.log 2>&1
done
fi
