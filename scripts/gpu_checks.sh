#!/usr/bin/env bash
# The GPU checks of issues 27 and 28, for a lent GPU machine whose python3 holds torch, Lightning
# and torchvision (the package runs from the checkout: PYTHONPATH). Every step has its own time
# limit and its output is packed into OUT_DIR/gpu.tgz after each step, so a step that fails or
# runs out of time loses nothing the others made.
#
#   bash scripts/gpu_checks.sh OUT_DIR DATA_DIR smoke   # ~2 min: CUDA tests + each benchmark --quick
#   bash scripts/gpu_checks.sh OUT_DIR DATA_DIR full    # the runs the issues ask for (limits sum to 540 s: one call)
#   bash scripts/gpu_checks.sh OUT_DIR DATA_DIR s49     # session 49: full, with pair-flip noise and Ren et al. (540 s)
#   bash scripts/gpu_checks.sh OUT_DIR DATA_DIR next    # what session 49 left: the per-step cuts' wall time, peak memory (470 s)
#
# DATA_DIR holds mnist/ and fashion-mnist/ (the IDX .gz files of ../shared/data).
#
# Sending the checkout to a lent GPU machine (session 42): the tracked tree is ~100 MiB, over the
# device tool's 64 MiB, almost all of it benchmarks/results. Before the call, in the checkout:
#   mkdir -p .gpudata && cp -r ../shared/data/mnist ../shared/data/fashion-mnist .gpudata/
#   printf '/.gpudata/\n/benchmarks/results/\n' >> .git/info/exclude
#   git rm -r -q --cached benchmarks/results      # untracked for the call only
# run with carry [".gpudata"] and the command `bash scripts/gpu_checks.sh $OUT .gpudata full`;
# afterwards `git reset -q`, drop the /benchmarks/results/ line from .git/info/exclude and
# `rm -rf .gpudata`. The machine's python3 has torch, Lightning, torchvision, pytest (no Optuna:
# carry it as wheels, see the device tool's README, for the Optuna arm).
set -u
OUT=$(realpath "$1")
DATA=$(realpath "$2")
MODE=${3:-smoke}
WORK=/tmp/gpu_checks
mkdir -p "$WORK/logs" "$WORK/res"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}

pack() { tar czf "$OUT/gpu_$MODE.tgz" -C "$WORK" . ; }
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, log, record its exit status
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit took=$((SECONDS - start))s" | tee -a "$WORK/steps.txt"
  tail -n 3 "$WORK/logs/$name.log"
  pack
}

nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1
"$PY" -c "import torch, pytorch_lightning as pl, torchvision; print('torch', torch.__version__, \
'lightning', pl.__version__, 'torchvision', torchvision.__version__, 'gpu', \
torch.cuda.get_device_name(0))" | tee "$WORK/versions.txt"
pack

if [ "$MODE" = smoke ]; then
  step cuda_tests 100 "$PY" -m pytest -q -p no:cacheprovider -m cuda -x \
    tests/test_gpu.py tests/test_core_api.py tests/test_bad_input.py tests/test_budget.py
  step resnet18_quick 60 "$PY" benchmarks/bench_weight_decay.py --settings fashion_resnet18 \
    --accelerator gpu --optuna-trials 0 --quick --methods no_wd learned_per_layer \
    --fashion-data "$DATA/fashion-mnist" --out "$WORK/res/resnet18_quick.json"
  step network_cost_quick 60 "$PY" benchmarks/bench_network_cost.py --accelerator gpu --quick \
    --configs plain default --out "$WORK/res/network_cost_quick.json"
  step noisy_quick 60 "$PY" benchmarks/bench_noisy_labels.py --accelerator gpu --quick \
    --methods plain drop_in oracle --data "$DATA" --out "$WORK/res/noisy_quick.json"
elif [ "$MODE" = rerun ]; then  # after the first full run's fixes (sparse norm on CUDA)
  step cuda_tests 60 "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_gpu.py tests/test_core_api.py tests/test_bad_input.py tests/test_budget.py
  step noisy_labels 150 "$PY" benchmarks/bench_noisy_labels.py --accelerator gpu \
    --datasets fashion mnist --noise symmetric --epochs 12 --seeds 1 2 3 \
    --methods plain drop_in oracle --data "$DATA" --out "$WORK/res/noisy_labels_gpu.json"
  step resnet18 130 "$PY" benchmarks/bench_weight_decay.py --settings fashion_resnet18 \
    --accelerator gpu --optuna-trials 0 --seeds 2 3 --methods no_wd grid learned_per_layer \
    --fashion-data "$DATA/fashion-mnist" --out "$WORK/res/resnet18_gpu.json"
elif [ "$MODE" = s49 ]; then  # session 49 (H200): today's code, both noises, the ren alternative
  step cuda_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_gpu.py tests/test_core_api.py tests/test_bad_input.py tests/test_budget.py
  # issue 27 item 5: 40 % symmetric and pair-flip noise, seeds 1-3, plain / drop-in / oracle / Ren
  step noisy_labels 170 "$PY" benchmarks/bench_noisy_labels.py --accelerator gpu \
    --datasets fashion mnist --noise symmetric pair --epochs 12 --seeds 1 2 3 \
    --methods plain drop_in oracle ren --data "$DATA" --out "$WORK/res/noisy_labels_gpu.json"
  step network_cost 80 "$PY" benchmarks/bench_network_cost.py --accelerator gpu --repeats 2 \
    --configs plain default --out "$WORK/res/network_cost_gpu.json"
  step sample_weight_cost 50 "$PY" benchmarks/bench_sample_weight_cost.py --device cuda \
    --steps 10 --out "$WORK/res/sample_weight_cost_gpu.json"
  step resnet18 150 "$PY" benchmarks/bench_weight_decay.py --settings fashion_resnet18 \
    --accelerator gpu --optuna-trials 0 --seeds 0 1 --methods no_wd grid learned_per_layer \
    --fashion-data "$DATA/fashion-mnist" --out "$WORK/res/resnet18_gpu.json"
elif [ "$MODE" = next ]; then  # for the next GPU session: what session 49 left unmeasured
  step cuda_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_gpu.py tests/test_core_api.py tests/test_bad_input.py tests/test_budget.py
  # the per-step operation cuts of session 49 on the GPU: the drop-in's wall time over plain
  # (H200, before them: 2.03-2.81x), and the same counts as on the CPU
  step noisy_labels 170 "$PY" benchmarks/bench_noisy_labels.py --accelerator gpu \
    --datasets fashion mnist --noise symmetric pair --epochs 12 --seeds 1 2 3 \
    --methods plain drop_in oracle --data "$DATA" --out "$WORK/res/noisy_labels_gpu.json"
  step step_ops 60 "$PY" benchmarks/bench_step_ops.py --out "$WORK/res/step_ops.json"
  # the per-sample hyper step's peak GPU memory, the softmax rows included (JSON this time)
  step sample_weight_cost 150 "$PY" benchmarks/bench_sample_weight_cost.py --device cuda \
    --steps 5 --sizes 1000 1000000 --out "$WORK/res/sample_weight_cost_gpu.json"
else
  step cuda_tests 80 "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_gpu.py tests/test_core_api.py tests/test_bad_input.py tests/test_budget.py
  # issue 28 item 5: the full-length ResNet-18 setting (4 epochs, 2000/2000/5000), the default
  # and no decay and the 6-value grid's pick, seeds 0 and 1
  step resnet18 160 "$PY" benchmarks/bench_weight_decay.py --settings fashion_resnet18 \
    --accelerator gpu --optuna-trials 0 --seeds 0 1 --methods no_wd grid learned_per_layer \
    --fashion-data "$DATA/fashion-mnist" --out "$WORK/res/resnet18_gpu.json"
  # issue 28 item 1 on the GPU: the default's cost ratio on every network of the matrix
  step network_cost 100 "$PY" benchmarks/bench_network_cost.py --accelerator gpu --repeats 2 \
    --configs plain default --out "$WORK/res/network_cost_gpu.json"
  # issue 27 item 1 on the GPU: a hyper step's time and memory for n = 1e3 ... 1e6 weights
  step sample_weight_cost 70 "$PY" benchmarks/bench_sample_weight_cost.py --device cuda \
    --steps 10 --out "$WORK/res/sample_weight_cost_gpu.json"
  # issue 27: the noisy-label CNN benchmark (40 % symmetric noise, 12 epochs), seeds 1-3
  step noisy_labels 130 "$PY" benchmarks/bench_noisy_labels.py --accelerator gpu \
    --datasets fashion mnist --noise symmetric --epochs 12 --seeds 1 2 3 \
    --methods plain drop_in oracle --data "$DATA" --out "$WORK/res/noisy_labels_gpu.json"
fi
echo "done $MODE"
