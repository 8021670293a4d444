# ruff: noqa
"""Session 44 (mse44): why a squared error with outlying targets learned nothing under the
self-normalised loss (docs/data_weights.md "Other tasks"). Fits the toy of
tests/test_data_weights_tasks.py (240 examples, the first 72 targets moved by +-6; objective
"mean_loss") and records every training batch's cross term: the rows, u_i = <grad l_i, v>, omega_i,
the batch centre u_hat (the weighted mean of u) and the row's hypergradient; prints them for
outlier vs clean rows.
Run from the repository root:
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/data_weights_outliers_s44/probe.py LOSS GAUGE
LOSS: mse | huber | l1; GAUGE: batch | mean_logit | auto."""

import sys, warnings, logging

sys.path.insert(0, "tests")
import torch, torch.nn.functional as F
from test_data_weights_tasks import Task, mlp, regression, fit, BAD, N
from hypertorch_sid.core import sample_weights as sw

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning").setLevel(logging.ERROR)
loss = sys.argv[1] if len(sys.argv) > 1 else "mse"
gauge = sys.argv[2] if len(sys.argv) > 2 else "batch"
LF = {"mse": F.mse_loss, "huber": F.huber_loss, "l1": F.l1_loss}[loss]
rec = []
orig = sw.TrainingCrossTerm.gradients


def spy(self, index, u, alpha, losses=None):
    out = orig(self, index, u, alpha, losses)
    w = self.weights
    omega = w.parameterization.rows(w.logits.detach()[index], w, index, losses).detach()
    uu = sw.check_per_sample(u, index).detach()
    uhat = float((omega * uu).sum() / omega.sum())
    rec.append(
        (
            index.clone(),
            uu.clone(),
            omega.clone(),
            uhat,
            out[0].coalesce().to_dense()[index].clone(),
        )
    )
    return out


sw.TrainingCrossTerm.gradients = spy
step = lambda z, y: LF(z, y, reduction="none")[:, 0]
cb = fit(Task(mlp(4, 1), step), regression(1), objective="mean_loss", gauge=gauge)
w = cb.data_weights()
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    fl = cb.flagged()
tp = int((fl < BAD).sum())
print(
    f"{loss}, gauge {cb.problem.weights.gauge}: omega outliers {w[:BAD].mean():.3f} clean {w[BAD:].mean():.3f}; "
    f"flagged {len(fl)} ({tp} outliers)",
    [str(x.message)[:90] for x in ws],
)
print(f"{len(rec)} training batches with a cross term")
for bad, name in ((True, "outlier"), (False, "clean")):
    u = torch.cat([r[1][(r[0] < BAD) == bad] for r in rec])
    c = torch.cat([(r[1] - r[3])[(r[0] < BAD) == bad] for r in rec])
    g = torch.cat([r[4][(r[0] < BAD) == bad] for r in rec])
    print(
        f"  {name:8s} u: mean {u.mean():+9.3f} median {u.median():+8.3f} mean|u| {u.abs().mean():8.3f} "
        f"u>0 {(u > 0).float().mean():.2f} | u - u_hat: mean {c.mean():+8.3f} >0 {(c > 0).float().mean():.2f} "
        f"| step down {(g > 0).float().mean():.2f}"
    )
uh = torch.tensor([r[3] for r in rec])
print(f"  u_hat across batches: mean {uh.mean():+.3f} std {uh.std():.3f}")
share = [float((r[2] * r[1]).abs()[r[0] < BAD].sum() / (r[2] * r[1]).abs().sum()) for r in rec]
print(
    f"  outliers' share of sum |omega_i u_i| per batch: {sum(share) / len(share):.2f} (of the rows: {BAD / N:.2f})"
)
# per row over its visits: mean / rms of the hypergradient (what a per-row Adam steps by; > 0: down)
s1, s2, k = torch.zeros(N), torch.zeros(N), torch.zeros(N)
for idx, u, om, uh_, g in rec:
    s1.index_add_(0, idx, g)
    s2.index_add_(0, idx, g * g)
    k.index_add_(0, idx, torch.ones_like(g))
snr = (s1 / k) / (s2 / k).sqrt().clamp_min(1e-30)
print(
    f"  per row mean(g)/rms(g) (> 0: pushed down): outliers {snr[:BAD].mean():+.3f}, clean {snr[BAD:].mean():+.3f}"
)
