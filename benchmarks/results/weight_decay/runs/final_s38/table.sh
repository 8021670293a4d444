#!/usr/bin/env bash
# The deployment tables with this version's defaults in the default's place: the sources of
# weight_decay_deployment_9seeds_trust_rprop / _news_trust_rprop (their `command` in the JSON) with this
# folder's runs as --retrained (or those of the folder given, e.g. final_s38_overhead, and TAG for the output names).
# Run from the repository root after run.sh:  bash .../final_s38/table.sh [FOLDER TAG]
set -euo pipefail
PY=${PYTHON:-python}
F=${1:-final_s38} TAG=${2:-final_s38}
R=benchmarks/results/weight_decay
src=$($PY -c "import json; c=json.load(open('$R/weight_decay_deployment_9seeds_trust_rprop.json'))['command']; print(c.split('--summarise ')[1].split(' --retrained')[0])")
news=$($PY -c "import json; c=json.load(open('$R/weight_decay_deployment_9seeds_news_trust_rprop.json'))['command']; print(c.split('--summarise ')[1].split(' --retrained')[0])")
new=""; for s in mnist_mlp fashion_mlp mnist_cnn fashion_cnn digits_mlp digits_small; do
  for k in 0 1 2 3 4 5 6 7 8; do new="$new $R/runs/$F/${s}_seed$k.json"; done; done
newnews=""; for k in 0 1 2 3 4 5 6 7 8; do newnews="$newnews $R/runs/$F/news_mlp_seed$k.json"; done
PYTHONPATH=$PWD $PY benchmarks/bench_weight_decay.py --summarise $src --retrained $new \
  --out $R/weight_decay_deployment_9seeds_$TAG.json
PYTHONPATH=$PWD $PY benchmarks/bench_weight_decay.py --summarise $news --retrained $newnews \
  --out $R/weight_decay_deployment_9seeds_news_$TAG.json
