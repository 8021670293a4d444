"""hypertorch_sid.plots reads the CSV log the callbacks write and draws it (function and CLI)."""

import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.plots import lambda_names, plot_training, read_metrics


class MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, granularity):
    X, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
    train = DataLoader(TensorDataset(X[:192], y[:192]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64)
    trainer = pl.Trainer(
        max_epochs=3,
        logger=CSVLogger(tmp_path, name=granularity),
        callbacks=[  # a 36-step fit: too short for the default budget to pay for a hyper step
            LearnedWeightDecay(1e-3, granularity=granularity, every_n_steps=3, max_overhead=None)
        ],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLP(), train, val)
    return trainer


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logs")
    per_layer = _fit(tmp, "per_layer")
    assert {"lam", "hg"} <= set(per_layer.progress_bar_metrics)
    _fit(tmp, "per_element")
    return tmp


def test_read_metrics_has_lambda_per_layer_and_the_solves(logs):
    series = read_metrics(logs / "per_layer")
    assert lambda_names(series) == ["hyper/weight_decay/net.0", "hyper/weight_decay/net.2"]
    steps, values = series["hyper/weight_decay/net.0_mean"]
    assert steps == sorted(steps) and len(steps) == 12 and all(v > 0 for v in values)
    for key in ["hyper/hypergradient_norm", "hyper/adjoint_residual", "hyper/damping", "val_loss"]:
        assert len(series[key][1]) >= 3, key
    # the total over every layer is still logged
    total = series["hyper/weight_decay_mean"][1][-1]
    parts = [series[f"{n}_mean"][1][-1] for n in lambda_names(series)]
    assert total == pytest.approx(sum(parts) / len(parts), rel=1e-6)


def test_per_element_lambda_has_ordered_quantile_bands(logs):
    series = read_metrics(logs / "per_element")
    names = lambda_names(series)
    assert names == [
        "hyper/weight_decay/net.0.bias",
        "hyper/weight_decay/net.0.weight",
        "hyper/weight_decay/net.2.bias",
        "hyper/weight_decay/net.2.weight",
    ]
    n = "hyper/weight_decay/net.0.weight"
    cols = [series[f"{n}_{s}"][1] for s in ("min", "q10", "q25", "q50", "q75", "q90", "max")]
    for row in zip(*cols):
        assert list(row) == sorted(row)


def test_plot_training_writes_a_figure(logs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "per_element.png"
    fig = plot_training(logs / "per_element", out, title="per element")
    assert out.stat().st_size > 10_000
    assert len(fig.axes) == 4
    assert fig.axes[0].get_yscale() == "log"


def test_command_line(logs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "cli.png"
    run = subprocess.run(
        [sys.executable, "-m", "hypertorch_sid.plots", str(logs / "per_layer"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 10_000


def test_a_folder_without_a_log_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="CSVLogger"):
        read_metrics(tmp_path)
