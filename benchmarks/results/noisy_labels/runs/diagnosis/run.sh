# issue 27 diagnosis of the symmetric-noise gap (MNIST and Fashion symmetric 40 %, seeds 1-2, the clipped
# recipe, 12 epochs; 1 thread each, the two data sets in parallel on the shared 2-core CPU)
R=benchmarks/results/noisy_labels/runs/diagnosis
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
# (a) plain, oracle, the instrumented default drop-in, hindsight (its final weights fixed from step 0),
# hindsight100 (the same from step 100); the visits of every row; per epoch p(noisy label)
for DS in mnist fashion; do $PY benchmarks/noisy_labels_diagnosis.py --datasets $DS --seeds 1 2 --out $R/$DS.json.gz & done; wait
# the drop-in's weights as they were at steps 160/192/224, fixed from step 0 (a rewind, screened)
for DS in mnist fashion; do $PY benchmarks/noisy_labels_rewind_screen.py --diagnosis $R/$DS.json.gz --steps 160 192 224 --out $R/rewind_screen_$DS.json & done; wait
# which errors of the final weights cost what (one group of rows corrected at a time)
for DS in mnist fashion; do $PY benchmarks/noisy_labels_hindsight_variants.py --diagnosis $R/$DS.json.gz --out $R/hindsight_variants_$DS.json & done; wait
# (b), (c): per-group evidence, steps, memorisation; the class pairs of the corrupted rows kept
$PY benchmarks/noisy_labels_diagnosis.py --analyse $R/mnist.json.gz $R/fashion.json.gz > $R/analysis.txt
$PY benchmarks/noisy_labels_diagnosis.py --pairs $R/mnist.json.gz $R/fashion.json.gz > $R/pairs.txt
$PY $R/table.py
