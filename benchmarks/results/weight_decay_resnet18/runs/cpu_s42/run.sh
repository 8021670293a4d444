# Fashion-MNIST ResNet-18 (2000/2000/5000, 4 epochs, batch 64) on the CPU with today's default
# (session 42). The grid's runs are reused from the stored CPU runs of the same seeds
# (weight_decay_resnet18_cpu_seed{0,1,2}.json; they do not depend on the package).
# 1. main at 687c9ad (the GPU fixes; the probe on the whole batch):
python benchmarks/bench_weight_decay.py --settings fashion_resnet18 --seeds 0 1 2 --optuna-trials 0 \
  --methods no_wd learned_per_layer --threads 1 \
  --reuse 'benchmarks/results/weight_decay_resnet18/runs/weight_decay_resnet18_cpu_seed{seed}.json' \
  --out benchmarks/results/weight_decay_resnet18/runs/cpu_s42/main_687c9ad/resnet18_cpu_s42.json
# 2. the probe on 16 samples with one base loss (the default learned again, the rest reused from 1.):
python benchmarks/bench_weight_decay.py --settings fashion_resnet18 --seeds 0 1 2 --optuna-trials 0 \
  --methods learned_per_layer --threads 1 \
  --reuse 'benchmarks/results/weight_decay_resnet18/runs/cpu_s42/main_687c9ad/resnet18_cpu_s42_seed{seed}.json' \
  --out benchmarks/results/weight_decay_resnet18/runs/cpu_s42/probe16/resnet18_cpu_probe16.json
