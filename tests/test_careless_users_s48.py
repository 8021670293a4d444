"""A careless user's inputs that gave silent wrong answers (session 48; the table of every recipe
tried and its outcome is in docs/failures.md, "Careless users (session 48)").

Each test fails without its fix: the hyper steps drew from samples the loaders never read (one
data set split by two ``SubsetRandomSampler``), validation data that is the training data went
unsaid, a resumed fit kept the checkpoint's outer learning rate over the one asked for, and
masked examples (``ignore_index``) had their data weights learned and flagged without a word,
and settings the drop-ins do not read (``num_classes`` per sample, ``outer_lr`` beside
``outer_optimizer=``, ``elements=`` per layer) were accepted and ignored.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_C,
    TOY_D,
    TOY_N,
    TOY_X,
    TOY_Y,
    ToyClassifier,
    quick_decay,
    toy_val,
    trainer,
)
from torch import Tensor, nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)

N, D, C = TOY_N, TOY_D, TOY_C
X, Y = TOY_X, TOY_Y


class Tagged(Dataset):
    """(x, y, position): the position says which example a hyper step drew."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        return X[i], Y[i], i


Net = ToyClassifier


def _fit(
    cb: Any, train: DataLoader, val: DataLoader, epochs: int = 1, model: Any = None, **kw: Any
) -> list[str]:
    """Fit; the warnings' messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=epochs, **kw).fit(model or Net(), train, val)
    return [str(w.message) for w in caught]


def _shared(messages: list[str]) -> list[str]:
    return [m for m in messages if "validation examples are training examples too" in m]


def test_one_data_set_split_by_two_samplers_keeps_the_hyper_steps_on_their_split():
    """``DataLoader(ds, sampler=SubsetRandomSampler(train_idx))`` and the same for validation
    (PyTorch tutorials' split): the hyper steps drew from the whole ``ds``, so about 70 % of their
    "validation" examples were training examples (E fitted the training data) and about a
    quarter of their training ones validation examples. Now each draws from its sampler's indices."""
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    train_idx, val_idx = perm[:160], perm[160:]
    cb, ds = quick_decay(), Tagged()
    said = _fit(
        cb,
        DataLoader(ds, batch_size=16, sampler=SubsetRandomSampler(train_idx)),
        DataLoader(ds, batch_size=20, sampler=SubsetRandomSampler(val_idx)),
    )
    val_drawn = torch.cat([cb.data.validation_batch()[2] for _ in range(8)]).tolist()
    train_drawn = torch.cat([next(cb.data.train)[2] for _ in range(12)]).tolist()
    assert set(val_drawn) <= set(val_idx)
    assert set(train_drawn) <= set(train_idx)
    assert (cb.data.n_train, cb.data.n_val) == (160, 80)
    assert not _shared(said)


def test_a_weighted_sampler_of_unequal_weights_is_said_and_one_of_a_subset_is_followed():
    """Oversampling by a WeightedRandomSampler: the hyper steps draw uniformly (warned); equal
    weights over a subset (0 elsewhere) are a subset: the hyper steps draw from it."""
    weights = torch.ones(N)
    weights[: N // 2] = 4.0
    train = DataLoader(Tagged(), batch_size=16, sampler=WeightedRandomSampler(weights, N))
    said = _fit(quick_decay(), train, DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20))
    assert any("WeightedRandomSampler of unequal weights" in m for m in said)

    half = (torch.arange(N) % 2 == 0).double()
    cb = quick_decay()
    said = _fit(
        cb,
        DataLoader(Tagged(), batch_size=16, sampler=WeightedRandomSampler(half, N)),
        DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20),
    )
    drawn = torch.cat([next(cb.data.train)[2] for _ in range(12)])
    assert bool((drawn % 2 == 0).all()) and cb.data.n_train == N // 2
    assert not any("WeightedRandomSampler" in m for m in said)


@pytest.mark.parametrize(
    "how", ["the same loader", "TensorDataset built twice", "overlapping samplers"]
)
def test_validation_data_that_is_training_data_is_said(how):
    """Validation examples the training reads too: the hypergradient then tunes λ for the fit to
    training data (a weight decay falls towards 0). It went unsaid; now a warning counts them."""
    if how == "the same loader":
        train = val = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)
        expected = f"{N} of the {N} validation"
    elif how == "TensorDataset built twice":
        train = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)
        val = DataLoader(TensorDataset(X, Y), batch_size=20)
        expected = f"{N} of the {N} validation"
    else:
        ds = Tagged()
        train = DataLoader(ds, batch_size=16, sampler=SubsetRandomSampler(range(200)))
        val = DataLoader(ds, batch_size=20, sampler=SubsetRandomSampler(range(150, N)))
        expected = "50 of the 90 validation"
    said = _shared(_fit(quick_decay(), train, val))
    assert len(said) == 1 and expected in said[0]


def test_held_out_validation_data_is_not_warned():
    train_set, val_set = random_split(
        TensorDataset(X, Y), [0.75, 0.25], generator=torch.Generator().manual_seed(0)
    )
    said = _fit(
        quick_decay(),
        DataLoader(train_set, batch_size=16, shuffle=True),
        DataLoader(val_set, batch_size=20),
    )
    assert not _shared(said)


def _hopt(lr: float) -> SIDHyperOptimizer:
    w = torch.zeros(D, requires_grad=True)
    log_lam = torch.zeros(D, requires_grad=True)
    t = (X @ torch.ones(D)).detach()

    def inner(batch: Any) -> Tensor:
        return 0.5 * ((X @ w - t) ** 2).mean() + 0.5 * (log_lam.exp() * w**2).sum()

    def outer(batch: Any) -> Tensor:
        return 0.5 * ((X @ w - t) ** 2).mean()

    return SIDHyperOptimizer(
        hyperparameters=[log_lam],
        inner_parameters=[w],
        inner_loss=inner,
        outer_loss=outer,
        outer_optimizer=torch.optim.Adam([log_lam], lr=lr),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )


def test_a_resume_with_another_outer_lr_uses_it_and_says_so():
    """``load_state_dict`` took the checkpoint's learning rate with its moments: a fit resumed
    with ``outer_lr=0.5`` (the drop-ins' ``outer_lr=``) went on at the saved 1e-2, silently."""
    saved = _hopt(1e-2)
    saved.step([None], [None])
    state = saved.state_dict()

    resumed = _hopt(0.5)
    with pytest.warns(UserWarning, match=r"other outer optimizer settings.*lr 0\.01 → 0\.5"):
        resumed.load_state_dict(state)
    assert resumed.outer_optimizer.param_groups[0]["lr"] == 0.5
    moments = saved.outer_optimizer.state_dict()["state"][0]
    assert torch.equal(
        resumed.outer_optimizer.state_dict()["state"][0]["exp_avg"], moments["exp_avg"]
    )

    same = _hopt(1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.load_state_dict(state)
    assert same.outer_optimizer.param_groups[0]["lr"] == 1e-2


def test_a_resumed_data_weights_fit_takes_its_outer_lr(tmp_path):
    """The same through Lightning's ``ckpt_path=`` (LearnedDataWeights' LazyAdam at 1.0)."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20)
    settings = dict(start_step=4, every_n_steps=4, max_overhead=None)
    first = LearnedDataWeights(**settings)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([first, ckpt], max_epochs=1, enable_checkpointing=True).fit(Net("none"), train, val)
    resumed = LearnedDataWeights(outer_lr=0.25, **settings)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([resumed, ckpt], max_epochs=2, enable_checkpointing=True).fit(
            Net("none"), train, val, ckpt_path=str(tmp_path / "last.ckpt")
        )
    assert any("lr 1.0 → 0.25" in str(w.message) for w in caught)
    assert resumed.history[-1]["hyper/outer_lr"] == 0.25


def test_masked_examples_in_the_data_weights_training_are_said():
    """``F.cross_entropy``'s default ``ignore_index=-100`` on unlabelled rows: their losses are
    exactly 0, their weights were pushed below the corrupted rows' and flagged, silently."""
    labels = Y.clone()
    labels[::6] = -100
    train = DataLoader(IndexedDataset(TensorDataset(X, labels)), batch_size=24, shuffle=True)
    val = DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20)
    cb = LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(Net("none"), train, val)
    said = [str(w.message) for w in caught if "exactly 0" in str(w.message)]
    assert len(said) == 1 and "labelled -100: ignore_index?" in said[0]

    cb = LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=24, shuffle=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(Net("none"), train, val)
    assert not [w for w in caught if "exactly 0" in str(w.message)]


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: LearnedDataWeights(num_classes=10),
            r"num_classes=10 is read only with per='class'",
        ),
        (
            lambda: LearnedDataWeights(
                outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1), outer_lr=0.5
            ),
            r"outer_lr=0.5 sets the drop-in's own outer optimizer",
        ),
        (
            lambda: LearnedDataWeights(
                outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1), scale_prior=1.0
            ),
            r"scale_prior=1.0 sets",
        ),
        (
            lambda: LearnedWeightDecay(
                outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1), outer_lr=0.5
            ),
            r"outer_lr=0.5 sets the drop-in's own outer step",
        ),
        (
            lambda: LearnedWeightDecay(elements="shrunk"),
            r"elements='shrunk' .* only granularity='per_element'",
        ),
    ],
)
def test_settings_the_drop_ins_would_ignore_are_refused(make, match):
    """Accepted and ignored before: ``LearnedDataWeights(num_classes=10)`` learned per-sample
    weights (a user asking for class weights got none), ``outer_lr`` and the LazyAdam settings
    beside ``outer_optimizer=`` did nothing, nor did ``elements=`` per layer."""
    with pytest.raises(ConfigurationError, match=match):
        make()


def test_the_settings_that_are_read_are_still_taken():
    LearnedDataWeights(per="class", num_classes=3)
    LearnedDataWeights(outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1))
    LearnedWeightDecay(outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1))
    LearnedWeightDecay(granularity="per_element", elements="shrunk")
    LearnedWeightDecay(elements="layer_then_shrunk")  # the default, named


def _indexed() -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16, shuffle=True)


def test_a_data_weights_resume_under_another_parameterization_is_refused(tmp_path):
    """Resumed with ``parameterization="softmax"`` from a sigmoid fit, the stored logits were
    read as a softmax's: every weight jumped from ~0.5–0.98 to ~1e-4 and ``flagged()`` named
    nothing (3-class toy, 30 % noise: 185 flagged before the resume, 0 after), silently."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    settings = dict(start_step=4, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(
            [LearnedDataWeights(**settings), ModelCheckpoint(dirpath=tmp_path, save_last=True)],
            max_epochs=1,
            enable_checkpointing=True,
        ).fit(Net("none"), _indexed(), toy_val())
        last = str(tmp_path / "last.ckpt")
        with pytest.raises(ConfigurationError, match=r"parameterization='SigmoidWeights'"):
            trainer([LearnedDataWeights(parameterization="softmax", **settings)], max_epochs=2).fit(
                Net("none"), _indexed(), toy_val(), ckpt_path=last
            )
        same = LearnedDataWeights(**settings)  # the same settings resume as before
        trainer([same], max_epochs=2).fit(Net("none"), _indexed(), toy_val(), ckpt_path=last)
    assert same.sid is not None and same.sid.hyper_step > 2


@pytest.mark.parametrize(
    "other, match",
    [
        ({"parameterization": "projection"}, r"parameterization='log' \(this run: 'projection'\)"),
        ({"granularity": "per_tensor"}, r"granularity='per_layer' \(this run: 'per_tensor'\)"),
        ({"decoupled": True}, r"decoupled='False' \(this run: 'True'\)"),
    ],
)
def test_a_weight_decay_resume_under_other_settings_is_refused(other, match):
    """log λ read as λ (``parameterization="projection"``) was taken wherever it was feasible (λ
    above 1: log λ > 0), and otherwise refused as a checkpoint "of another problem"."""
    cb = quick_decay()
    _fit(cb, DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True), toy_val())
    state = cb.state_dict()
    with pytest.raises(ConfigurationError, match=match):
        LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None, **other).load_state_dict(state)
    LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None).load_state_dict(state)
    state.pop("hyperparameter_meaning")  # a checkpoint written before it was kept
    LearnedWeightDecay(1e-3, max_overhead=None, **other).load_state_dict(state)


def test_an_empty_validation_set_is_named():
    """``random_split`` sizes that leave validation empty read as "the hyper-step batch is larger
    than the data set (0 samples): lower batch_size", which no batch size fixes."""
    empty = DataLoader(TensorDataset(X[:0], Y[:0]), batch_size=20)
    with pytest.raises(ConfigurationError, match=r"validation dataloader's data set holds no"):
        _fit(quick_decay(), DataLoader(TensorDataset(X, Y), batch_size=16), empty)


class GroupLr(Net):
    """The first layer in its own parameter group, at ``lr=0`` (a "frozen" backbone) or on a
    schedule from 0 (warm-up) / down to 0 at one step (cosine annealing at T_max)."""

    def __init__(self, schedule: str, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.schedule = schedule

    def configure_optimizers(self) -> Any:
        first = 0.0 if self.schedule == "frozen" else 0.1
        opt = torch.optim.SGD(
            [
                {"params": self.net[0].parameters(), "lr": first},
                {"params": self.net[2].parameters()},
            ],
            lr=0.1,
        )
        if self.schedule == "frozen":
            return opt
        if self.schedule == "warm-up":
            sched: Any = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 30))
        else:
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _frozen_said(messages: list[str]) -> list[str]:
    return [m for m in messages if "have lr=0 at two hyper steps" in m]


def test_a_parameter_group_frozen_by_lr_0_is_said():
    """A backbone "frozen" by ``lr=0`` in its own group: the hyper steps treated it as trained,
    and learned its λ (1e-3 → 1.96 on an MLP) and the head's through it (0.52, against 0.89
    with the backbone out of the optimizer), silently."""
    said = _frozen_said(
        _fit(
            quick_decay(),
            DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True),
            toy_val(),
            2,
            GroupLr("frozen"),
        )
    )
    assert len(said) == 1 and "net.0.weight, net.0.bias" in said[0]

    cb = LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=2).fit(GroupLr("frozen", "none"), _indexed(), toy_val())
    assert len(_frozen_said([str(w.message) for w in caught])) == 1


@pytest.mark.parametrize("schedule", ["warm-up", "cosine"])
def test_a_schedule_that_touches_lr_0_is_no_frozen_group(schedule):
    cb = quick_decay()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=2).fit(
            GroupLr(schedule), DataLoader(TensorDataset(X, Y), batch_size=16), toy_val()
        )
    assert not _frozen_said([str(w.message) for w in caught])


def test_a_random_subset_sampler_under_limit_train_batches_is_not_called_unshuffled():
    """``limit_train_batches=3`` over a ``SubsetRandomSampler`` reads a new random part of the
    split every epoch: it was warned as "an order that does not shuffle"."""
    train = DataLoader(Tagged(), batch_size=16, sampler=SubsetRandomSampler(range(200)))
    val = DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20)
    said = _fit(quick_decay(), train, val, 2, limit_train_batches=3)
    assert not [m for m in said if "does not shuffle" in m]


class RawMLP(Net):
    """A two-layer MLP written with raw parameters on the module (``hidden=0``: a linear model,
    one matrix and a bias)."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        del self.net
        width = hidden or C
        self.w1 = nn.Parameter(0.3 * torch.randn(D, width))
        self.b1 = nn.Parameter(torch.zeros(width))
        self.hidden = hidden
        if hidden:
            self.w2 = nn.Parameter(0.3 * torch.randn(hidden, C))

    def forward(self, x: Tensor) -> Tensor:
        z = x @ self.w1 + self.b1
        return torch.tanh(z) @ self.w2 if self.hidden else z


def test_layers_written_as_raw_parameters_get_a_lambda_each():
    """``granularity="per_layer"`` gives one λ per module owning tensors: w1, b1 and w2 on the
    LightningModule itself all got the one λ "(root)", as "global" would (session 48: said by a
    warning; session 63: the module itself is no layer, so each tensor is its own)."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)
    cb = quick_decay()
    said = _fit(cb, train, toy_val(), model=RawMLP())
    assert cb.slot_names == ["w1", "b1", "w2"]
    assert sorted(cb.learned_weight_decay) == ["b1", "w1", "w2"]
    assert not [m for m in said if "share one λ" in m]


def test_shared_examples_are_counted_through_nested_subsets():
    from torch.utils.data import Subset

    from hypertorch_sid.lightning.sampling import shared_examples

    base = TensorDataset(X, Y)
    outer = Subset(base, list(range(100, 200)))  # base rows 100..199
    train = IndexedDataset(Subset(outer, list(range(0, 60))))  # base rows 100..159
    val = Subset(base, list(range(150, 170)))  # base rows 150..169: 10 shared
    assert shared_examples(train, val) == (10, 20)
    assert shared_examples(train, Subset(base, list(range(160, 170)))) == (0, 10)
    # a copy of the tensors holds the same examples (compared by content since session 51)
    assert shared_examples(train, TensorDataset(X.clone(), Y)) == (60, N)
    # other examples (compared row by row since session 57: none shared)
    assert shared_examples(train, TensorDataset(X + 1, Y)) == (0, N)
    assert shared_examples(base, TensorDataset(X, Y)) == (N, N)  # the same tensors


def test_the_base_callback_refuses_outer_lr_beside_outer_optimizer():
    """``HyperOptimizationCallback(outer_lr=0.5, outer_optimizer=...)`` ran at the optimizer's
    own learning rate, outer_lr silently ignored (its default could not be told from a given
    value); now refused, naming the fix. Either alone, and the drop-ins' own outer steps with a
    user's optimizer, are accepted."""
    from hypertorch_sid import HyperOptimizationCallback

    adam = functools.partial(torch.optim.Adam, lr=0.1)
    with pytest.raises(ConfigurationError, match="outer_lr=0.5.*would be ignored"):
        HyperOptimizationCallback(outer_lr=0.5, outer_optimizer=adam)
    assert HyperOptimizationCallback().outer_lr == 1e-2
    assert HyperOptimizationCallback(outer_lr=0.5).outer_lr == 0.5
    assert HyperOptimizationCallback(outer_optimizer=adam).outer_optimizer is adam
    LearnedWeightDecay(1e-3, outer_optimizer=adam)
    LearnedDataWeights(outer_optimizer=adam)


def test_a_validation_loader_over_an_indexed_dataset_is_said_before_validation_runs():
    """The training set wrapped in IndexedDataset, the validation set too: the user's
    validation_step got (index, x, y) batches and failed inside the user's code ("mat1 and mat2
    must have the same dtype", the index read as the input). Said at fit start now; without a
    validation_step (the hyper steps read Indexed batches themselves) nothing is said."""
    val = DataLoader(IndexedDataset(TensorDataset(X[:60], Y[:60])), batch_size=20)

    class Strict(Net):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self(batch[0])  # the index, for an Indexed batch

    cb = LearnedDataWeights(start_step=0, every_n_steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError):
            trainer([cb], max_epochs=1).fit(Strict(reduction="none"), _indexed(), val)
    said = [
        str(w.message) for w in caught if "DataLoader(IndexedDataset(val_set))" in str(w.message)
    ]
    assert len(said) == 1

    class NoValidationStep(Net):
        validation_step = pl.LightningModule.validation_step

    messages = _fit(LearnedDataWeights(start_step=0, every_n_steps=4), _indexed(), val,
                    model=NoValidationStep(reduction="none"))  # fmt: skip
    assert not [m for m in messages if "IndexedDataset(val_set)" in m]


def test_an_initial_decay_the_learning_rate_cannot_train_is_named():
    """λ₀ = 1e-3 with SGD at lr = 1e4 (lr·λ₀ = 10: every step would shrink the weights past 0):
    refused at fit start naming the learning rate and the bound; before, "the initial
    hyperparameters are outside the feasible set: the projection moves hyperparameter 0 from
    [-9.21] to [-6.908]" (log λ, the two values swapped)."""

    class Fast(Net):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e4)

    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    with pytest.raises(ConfigurationError, match=r"weight_decay=0.001 .*lr=10000 \(0.0001"):
        _fit(cb, DataLoader(TensorDataset(X, Y), batch_size=16), toy_val(), model=Fast())
    _fit(LearnedWeightDecay(1e-5, every_n_steps=4, max_overhead=None),
         DataLoader(TensorDataset(X, Y), batch_size=16), toy_val(), model=Fast())  # fmt: skip


class Regression(Net):
    """A linear least-squares fit; ``lr`` large enough makes SGD diverge (the loss grows)."""

    def __init__(self, lr: float, nan_at: int | None = None) -> None:
        super().__init__()
        self.net = nn.Linear(D, 1)
        self.lr, self.nan_at = lr, nan_at

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = F.mse_loss(self(batch[0]).squeeze(1), batch[1].float())
        return loss * float("nan") if batch_idx == self.nan_at else loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_a_nan_loss_from_finite_weights_is_not_blamed_on_the_learning_rate():
    """A training_step that returns NaN on one batch (log of 0, 0/0) made the weights NaN, and
    the error said "the training optimizer diverged …: lower its learning rate". The losses
    Lightning reports are now watched (on their device, read only then): a loss that went
    NaN from a moderate value is named as the cause; a loss that grew first is still the
    optimizer's divergence."""
    from hypertorch_sid import DivergenceError

    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    cb = LearnedWeightDecay(1e-3, every_n_steps=5, max_overhead=None, on_divergence="raise")
    with pytest.raises(
        DivergenceError, match="returned a non-finite loss at step 4.*will not help"
    ):
        _fit(cb, train, toy_val(), model=Regression(0.01, nan_at=3))
    cb = LearnedWeightDecay(1e-6, every_n_steps=5, max_overhead=None)  # hyper steps skipped
    with pytest.raises(DivergenceError, match="loss grew from .* diverged .*lower its learning"):
        _fit(cb, train, toy_val(), epochs=5, model=Regression(3.0))
