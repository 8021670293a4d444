"""What a GPU run met that a CPU run does not, guarded on the CPU (tests/test_gpu.py runs the
same fits on a CUDA device where one is lent): cuDNN's RNN kernels have no double backward,
SparseCUDA has no norm kernel, and an accelerator's work is asynchronous (the compute budget
must wait for it before it reads its clock)."""

from __future__ import annotations

from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.budget import OverheadBudget
from hypertorch_sid.core.second_order import twice_differentiable
from hypertorch_sid.core.solvers import norm


class RowLSTM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm, self.head = torch.nn.LSTM(6, 8, batch_first=True), torch.nn.Linear(8, 3)
        self.cudnn_seen: list[bool] = []
        self.lstm.register_forward_hook(
            lambda *_: self.cudnn_seen.append(torch.backends.cudnn.enabled)
        )

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out, _ = self.lstm(x)
        return F.cross_entropy(self.head(out[:, -1]), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_an_rnn_on_a_cuda_device_runs_the_hyper_steps_without_cudnn(monkeypatch):
    """The hyper step's forwards run with cuDNN off (else: "Double backwards is not supported
    for CuDNN RNNs"), the training's own with it; on the CPU nothing changes."""
    model = RowLSTM()
    with twice_differentiable(model):
        assert torch.backends.cudnn.enabled  # a CPU module: cuDNN as it was
    monkeypatch.setattr(
        "hypertorch_sid.core.second_order._on_cuda", lambda m: m is model.lstm
    )  # the LSTM as if on a GPU
    with twice_differentiable(model):
        assert not torch.backends.cudnn.enabled
    assert torch.backends.cudnn.enabled

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(96, 5, 6, generator=gen)
    data = TensorDataset(x, (x.sum((1, 2)) > 0).long())
    cb = LearnedWeightDecay(1e-4, every_n_steps=2, max_overhead=None)
    trainer([cb], max_epochs=2, limit_val_batches=0).fit(
        model, DataLoader(data, batch_size=16), DataLoader(data, batch_size=32)
    )
    assert len(cb.history) > 0
    assert True in model.cudnn_seen and False in model.cudnn_seen  # training on, hyper off


@pytest.fixture
def no_sparse_norm(monkeypatch):
    """torch.linalg.vector_norm refuses sparse tensors, as on SparseCUDA."""
    real = torch.linalg.vector_norm

    def vector_norm(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if x.is_sparse:
            raise NotImplementedError("'aten::linalg_vector_norm' from the 'SparseCUDA' backend")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "vector_norm", vector_norm)


def test_norm_takes_a_sparse_hypergradient_by_its_rows(no_sparse_norm):
    g = torch.sparse_coo_tensor(torch.tensor([[1, 4, 1]]), torch.tensor([3.0, 4.0, 0.0]), (6,))
    dense = torch.tensor([0.0, 12.0])
    assert norm([g]) == pytest.approx(5.0)
    assert norm([g, dense]) == pytest.approx(13.0)


def test_data_weights_drop_in_never_takes_a_norm_of_a_sparse_tensor(no_sparse_norm):
    from test_data_weights_recipes import assert_separates, fit

    assert_separates(fit())


def test_the_budget_waits_for_the_accelerator_at_a_hyper_steps_start_and_end(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waits.append(1))
    budget = OverheadBudget(0.5)
    budget.use_device("cpu")
    budget.start_hyper_step()
    budget.end_hyper_step()
    assert waits == []  # the CPU: nothing to wait for
    budget.use_device("cuda")
    budget.training_step_done()  # a training step's reading does not wait (keeps the overlap)
    assert waits == []
    budget.start_hyper_step()
    budget.end_hyper_step()
    budget.synchronized_clock()  # the product's timing
    assert len(waits) == 3
