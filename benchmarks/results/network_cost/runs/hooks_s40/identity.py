"""Bit-identity of small learned fits with every hyper step run (``max_overhead=None``): a hash of
the final weights and ρ, per granularity and optimizer. Run once per package version:

    PYTHONPATH=<package root> OMP_NUM_THREADS=1 python identity.py <repo root>
"""

import hashlib
import json
import sys

sys.path.insert(0, sys.argv[1] + "/tests")
import test_weight_decay as T  # noqa: E402

from hypertorch_sid.lightning import LearnedWeightDecay  # noqa: E402

out = {}
for gran in ["per_layer", "per_element", "global"]:
    for opt in ["sgd_momentum", "adam"]:
        model = T.MLP(T.OPTIMIZERS[opt], groups=True)
        cb = LearnedWeightDecay(0.01, granularity=gran, every_n_steps=2, max_overhead=None, seed=0)
        T._fit(model, [cb], max_epochs=3)
        h = hashlib.sha256()
        for v in [*model.state_dict().values(), *cb.rho]:
            h.update(v.detach().double().numpy().tobytes())
        out[f"{gran}/{opt}"] = [h.hexdigest()[:16], len(cb.history)]
print(json.dumps(out))
