"""A careless user's inputs that gave silent wrong answers or unclear failures (session 50; the
table of every recipe tried and its outcome is in docs/failures.md, "Careless users (session
50)"). Each test fails without its fix.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_C,
    TOY_D,
    TOY_X,
    TOY_Y,
    ToyClassifier,
    quick_decay,
    quick_weights,
    toy_val,
    trainer,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import hypertorch_sid.lightning.weight_decay as weight_decay_module
from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)

X, Y, D, C = TOY_X, TOY_Y, TOY_D, TOY_C


def _drop_in(drop_in: str, model: type) -> tuple[Any, DataLoader, Any]:
    """(the callback, the toy's training loader, ``model``) as each drop-in needs them."""
    if drop_in == "decay":
        return quick_decay(), DataLoader(TensorDataset(X, Y), batch_size=16), model()
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    return quick_weights(), train, model("none")


def _fit(cb: Any, train: Any, val: Any, model: Any, **kw: Any) -> list[str]:
    """Fit (one epoch unless said); the warnings' messages."""
    kw.setdefault("max_epochs", 1)
    ckpt_path = kw.pop("ckpt_path", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb] if not isinstance(cb, list) else cb, **kw).fit(
            model, train, val, ckpt_path=ckpt_path
        )
    return [str(w.message) for w in caught]


# ---------------------------------------------------------------- labels in dict samples
class DictSamples(Dataset):
    """``{"x": ..., "y": ...}`` samples; ``reorder_after`` reads reshuffle the rows (a dataset
    that shuffles itself each epoch: its indices are not stable)."""

    def __init__(self, labels: Tensor = Y, reorder_after: int | None = None) -> None:
        self.labels, self.reorder_after, self.reads = labels, reorder_after, 0
        self.order = torch.arange(len(labels))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        self.reads += 1
        if self.reorder_after and self.reads % self.reorder_after == 0:
            self.order = torch.randperm(
                len(self.labels), generator=torch.Generator().manual_seed(1)
            )
        j = int(self.order[i])
        return {"x": X[j], "y": self.labels[j]}


@dataclasses.dataclass
class Sample:
    image: Tensor
    label: Tensor


def _as_dataclass(batch: list[Any]) -> Sample:
    return Sample(torch.stack([s[0] for s in batch]), torch.stack([s[1] for s in batch]))


class DictNet(ToyClassifier):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if isinstance(batch, dict):
            x, y = batch["x"], batch["y"]
        else:  # a dataclass sample; the validation batches are (x, y) tuples
            x, y = (batch.image, batch.label) if isinstance(batch, Sample) else batch
        return F.cross_entropy(self(x), y, reduction=self.reduction)


def test_labels_in_dict_samples_are_read():
    """Dict samples (``batch["y"]``): the drop-in read labels as ``batch[1]`` only, so the
    label-change check, ``flagged("split_misfit")`` and the masked-row warning were silently
    off, and ``per="class"`` asked for ``target=``. They are read from the sample's ``"y"`` /
    ``"label"`` / ``"target"`` key (a dataclass's field) now."""
    # a data set that reorders its rows after the first epoch: refused, as tuple samples are
    train = DataLoader(IndexedDataset(DictSamples(reorder_after=len(Y))), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"had label \d on an earlier visit"):
        _fit(quick_weights(), train, toy_val(), DictNet("none"), max_epochs=2)

    # masked rows (-100) first read late: said at the epoch's end, as for tuple samples
    labels = Y.clone()
    labels[200:] = -100
    train = DataLoader(IndexedDataset(DictSamples(labels)), batch_size=8)
    said = [m for m in _fit(quick_weights(), train, toy_val(), DictNet("none")) if "exactly 0" in m]
    assert len(said) == 1 and "40 training examples have a negative label (-100" in said[0]

    # per-class weights without target=, dict and dataclass samples: the tuple samples' weights
    tuple_cb = quick_weights(per="class", num_classes=C)
    _fit(tuple_cb, DataLoader(TensorDataset(X, Y), batch_size=16), toy_val(), ToyClassifier("none"))
    dict_cb = quick_weights(per="class", num_classes=C)
    _fit(dict_cb, DataLoader(DictSamples(), batch_size=16), toy_val(), DictNet("none"))
    data_cb = quick_weights(per="class", num_classes=C)
    dataset = TensorDataset(X, Y)
    _fit(
        data_cb,
        DataLoader(dataset, batch_size=16, collate_fn=_as_dataclass),
        toy_val(),
        DictNet("none"),
    )
    want = tuple_cb.data_weights()
    torch.testing.assert_close(dict_cb.data_weights(), want)
    torch.testing.assert_close(data_cb.data_weights(), want)


def test_flagged_split_misfit_reads_the_labels_of_dict_samples():
    """``flagged("split_misfit")`` keeps the split's rows the network predicted as another
    class than their label; on dict samples no label was read and every split row came back.
    The rows now equal the tuple samples' fit's."""
    noisy = Y.clone()
    noisy[::4] = (noisy[::4] + 1) % C
    kw = dict(max_epochs=3)
    tuple_cb, dict_cb = quick_weights(), quick_weights()
    tuple_train = DataLoader(IndexedDataset(TensorDataset(X, noisy)), batch_size=16)
    _fit(tuple_cb, tuple_train, toy_val(), ToyClassifier("none"), **kw)
    dict_train = DataLoader(IndexedDataset(DictSamples(noisy)), batch_size=16)
    _fit(dict_cb, dict_train, toy_val(), DictNet("none"), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want, got = tuple_cb.flagged("split_misfit"), dict_cb.flagged("split_misfit")
        split = dict_cb.flagged(0.5)
    assert got.numel() < split.numel()
    assert torch.equal(got, want)


def test_a_dict_sample_with_two_label_keys_asks_for_target():
    """Two keys that could each be the label: nothing is guessed; ``per="class"`` names the
    keys and ``target=``."""

    class TwoKeys(DictSamples):
        def __getitem__(self, i: int) -> dict[str, Tensor]:
            return {**super().__getitem__(i), "label": Y[i]}

    with pytest.raises(ConfigurationError, match=r"keys \['label', 'x', 'y'\].*target="):
        _fit(
            quick_weights(per="class", num_classes=C),
            DataLoader(TwoKeys(), batch_size=16),
            toy_val(),
            DictNet("none"),
        )


# ---------------------------------------------------------------- invariance probe on resume
class LayerNormNet(ToyClassifier):
    """Linear → LayerNorm: the first layer is scale-invariant (its λ is held by default)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, C))


def test_a_resumed_fit_keeps_the_invariant_groups_its_checkpoint_was_probed_on(
    tmp_path, monkeypatch
):
    """The invariance probe's answer was not checkpointed: a fit killed and resumed probed
    again, on a network trained further, where a group near the threshold can answer
    otherwise and its held λ start moving. Simulated by a probe that finds nothing invariant
    after the resume: the LayerNorm layer's λ must stay held at λ₀, as in the uninterrupted
    fit."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    first = quick_decay()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    _fit([first, ckpt], train, toy_val(), LayerNormNet(), max_epochs=1, enable_checkpointing=True)
    assert first.invariant_groups == {"net.0": True, "net.1": False, "net.3": False}

    def nothing_invariant(problem: Any, *args: Any, **kwargs: Any) -> dict[str, bool]:
        return dict.fromkeys(problem.decay.group_names(), False)

    monkeypatch.setattr(weight_decay_module, "scale_invariant_slots", nothing_invariant)
    resumed = quick_decay()
    _fit(
        resumed, train, toy_val(), LayerNormNet(), max_epochs=3, enable_checkpointing=True,
        ckpt_path=str(tmp_path / "last.ckpt"),
    )  # fmt: skip
    assert resumed.invariant_groups == first.invariant_groups
    assert float(resumed.learned_weight_decay["net.0"]) == pytest.approx(1e-3)
    assert float(resumed.learned_weight_decay["net.3"]) != pytest.approx(1e-3)


# ---------------------------------------------------------------- rows masked by a 0 factor
class MaskedNet(ToyClassifier):
    """``(x, y, mask)`` samples, the per-sample loss multiplied by the mask; ``sharp``: logits
    ×100 after the fit's first 25 steps, so that well-fitted rows reach a loss of exactly 0."""

    def __init__(self, sharp: bool = False) -> None:
        super().__init__("none")
        self.sharp = sharp

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y, *mask = batch
        scale = 100.0 if self.sharp and self.global_step >= 25 else 1.0
        losses = F.cross_entropy(scale * self(x), y, reduction="none")
        return losses * mask[0] if mask else losses


def test_rows_masked_by_a_zero_factor_first_read_late_are_said():
    """Rows whose per-sample loss is multiplied by 0 (no negative label) that the training
    first reads after its first 20 batches: their weights were learned (0.36 against 0.50)
    without a word. At the epoch's end the rows of loss exactly 0 are re-read with the weights
    shrunk 1000-fold: still 0, they are masked. Well-fitted rows of loss exactly 0 (sharp
    logits) are not said."""
    mask = torch.ones(len(Y))
    mask[200:] = 0  # batches 25-29 of 30
    train = DataLoader(IndexedDataset(TensorDataset(X, Y, mask)), batch_size=8)
    said = [m for m in _fit(quick_weights(), train, toy_val(), MaskedNet()) if "exactly 0" in m]
    assert len(said) == 1 and "40 training examples had a loss exactly 0" in said[0]
    assert "rows [200, 201, 202, 203, 204]" in said[0]

    cb = quick_weights()
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=8)
    said = [
        m
        for m in _fit(cb, train, toy_val(), MaskedNet(sharp=True), max_epochs=2)
        if "exactly 0" in m
    ]
    assert not said
    assert int((cb.problem._last_loss == 0).sum()) > 100  # the rows it re-read and cleared


def test_a_hypergradient_after_exactly_zero_ones_is_no_zero_division():
    """Hypergradients exactly 0 (training and validation losses fitted to 0 in float32), then
    one that is not: the divergence guard divided by the median 0 of the last ones and raised
    ZeroDivisionError from inside the fit. A median of 0 is no scale to grow from."""
    from hypertorch_sid.core.divergence import DivergenceGuard

    guard = DivergenceGuard()
    for _ in range(3):
        guard.accept(0.0)
    guard.check(
        v_norm=0.0, v0_norm=0.0, grad_norm=1.0, etas=1.0, residual=0.0, first_residual=0.0,
        hypergradient_norm=0.1,
    )  # fmt: skip


def test_losses_fitted_to_exactly_0_early_are_not_called_masked():
    """Well-fitted rows whose loss is exactly 0 in the fit's first batches (sharp logits ×50,
    and a multi-class hinge past its margin): warned as "masked examples … (a hinge: ignore
    this)". They are re-computed with the weights shrunk first: not 0 there, not said; rows
    labelled -100 still are."""

    class Sharp(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return F.cross_entropy(50 * self(batch[0]), batch[1], reduction="none")

    class Hinge(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            out = self(batch[0])
            right = out.gather(1, batch[1][:, None])
            return (1 + out - right).clamp_min(0).scatter(1, batch[1][:, None], 0).sum(1)

    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=8)
    for net in (Sharp("none"), Hinge("none")):
        assert not [m for m in _fit(quick_weights(), train, toy_val(), net) if "exactly 0" in m]
    labels = Y.clone()
    labels[::6] = -100
    train = DataLoader(IndexedDataset(TensorDataset(X, labels)), batch_size=8)
    said = [m for m in _fit(quick_weights(), train, toy_val(), Sharp("none")) if "exactly 0" in m]
    assert len(said) == 1 and "labelled -100" in said[0]


# ---------------------------------------------------------------- optimizers
def test_lbfgs_moves_each_batchs_data_weights_once_per_step():
    """LBFGS's closure calls training_step at each of its line points (5 per step here): each
    call recorded the rows and moved their weights by the training batch's cross term, 5×
    per optimizer step, at points the training never stops at. Only the step's first call
    (at w) counts now."""
    import hypertorch_sid.lightning.data_weights as data_weights_module

    class LBFGSNet(ToyClassifier):
        def configure_optimizers(self) -> Any:
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=5)

    calls = []
    cross = data_weights_module.LearnedDataWeights._training_cross_term

    def counted(self: Any, *args: Any) -> None:
        calls.append(1)
        cross(self, *args)

    cb = quick_weights()
    cb._training_cross_term = counted.__get__(cb)  # type: ignore[method-assign]
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    t = trainer([cb], max_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(LBFGSNet("none"), train, toy_val())
    assert len(calls) == t.global_step == 15


@pytest.mark.parametrize("drop_in", ["decay", "weights"])
def test_an_optimizer_that_maximizes_is_refused(drop_in):
    """``SGD(maximize=True)`` with ``training_step`` returning the objective to maximise: the
    decay's λw, added to the gradient, was ascended with it (the weights grew; λ rose from
    1e-2 to 0.48 without a word). Refused at fit start, naming the fix."""

    class Ascend(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return -F.cross_entropy(self(batch[0]), batch[1], reduction=self.reduction)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, maximize=True)

    cb, train, net = _drop_in(drop_in, Ascend)
    with pytest.raises(ConfigurationError, match=r"maximize=True.*negated objective"):
        _fit(cb, train, toy_val(), net)


@pytest.mark.parametrize("drop_in", ["decay", "weights"])
def test_lazy_layers_not_created_before_the_fit_are_named(drop_in):
    """``nn.LazyLinear`` layers (their shape set by the first forward): torch's "Attempted to
    use an uninitialized parameter" from inside the callback's build. Named, with the fix,
    which then fits."""

    class Lazy(ToyClassifier):
        def __init__(self, reduction: str = "mean") -> None:
            super().__init__(reduction)
            self.net = nn.Sequential(nn.LazyLinear(16), nn.Tanh(), nn.LazyLinear(C))

    if drop_in == "decay":
        make, train, red = quick_decay, DataLoader(TensorDataset(X, Y), batch_size=16), "mean"
    else:
        make, red = quick_weights, "none"
        train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"net.0.weight.*model\(torch.zeros\(1, "):
        _fit(make(), train, toy_val(), Lazy(red))
    net = Lazy(red)
    net(torch.zeros(1, D))  # the fix named
    cb = make()
    _fit(cb, train, toy_val(), net)
    assert len(cb.history) > 0


# ---------------------------------------------------------------- callback settings
def test_an_initial_decay_near_the_stable_bound_is_warned():
    """``LearnedWeightDecay(6)`` at SGD lr 0.1 (lr·λ₀ = 0.6; the bound is 1/lr = 10, taken):
    each step wiped most of the weights, λ's hypergradient vanished with them, and after 10
    epochs the last layer's λ was 1.9 with the network at chance (validation loss 1.10 =
    log 3), silently. Warned at fit start now; λ₀ = 5 and below (which fell to 0) are not."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    said = [
        m
        for m in _fit(LearnedWeightDecay(6.0), train, toy_val(), ToyClassifier())
        if "above half" in m
    ]
    assert len(said) == 1 and "weight_decay=6 is above half" in said[0] and "lr=0.1" in said[0]
    assert not [
        m
        for m in _fit(LearnedWeightDecay(5.0), train, toy_val(), ToyClassifier())
        if "above half" in m
    ]


def test_an_empty_list_of_validation_loaders_is_named():
    """``trainer.fit(model, train, [])``: "the validation dataloader must be a torch
    DataLoader; got list", which reads as a type mistake. Said as no validation data."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"needs validation data .*\(got an empty list\)"):
        _fit(quick_decay(), train, [], ToyClassifier())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: LearnedDataWeights(normalize="false"), r"normalize must be True or False"),
        (lambda: LearnedDataWeights(sparse_grad=1), r"sparse_grad must be True or False"),
        (lambda: LearnedWeightDecay(1e-3, log_to_loggers="no"), r"log_to_loggers must be True"),
    ],
)
def test_switches_given_as_strings_are_refused(make, match):
    """``normalize="false"`` (a config's string) is truthy: the self-normalised loss ran where
    the user asked for the mean, silently (``LearnedWeightDecay``'s own switches were checked
    already)."""
    with pytest.raises(ConfigurationError, match=match):
        make()


# ---------------------------------------------------------------- BilevelModule
def test_a_loss_that_converts_its_batchs_dtype_is_not_refused():
    """float64 data (a NumPy array turned tensor) and a float32 model whose losses convert
    the batch (``x.float()``): the plain fit runs, but the first hyper step refused it ("batch[0]
    has dtype torch.float64 but the parameters are torch.float32") before any loss ran. The
    dtype is named now only where the loss fails on it."""
    from lightning_problems import loaders, ridge_data

    from hypertorch_sid import BilevelModule, HyperOptimizationCallback

    class Converts(BilevelModule):
        def __init__(self, converts: bool = True) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin, self.converts = nn.Linear(5, 1, bias=False), converts
            self.register_hyperparameter("log_lam", torch.zeros(5))

        def _fit(self, batch: Any) -> Tensor:
            x, y = (t.float() for t in batch) if self.converts else batch
            return 0.5 * ((self.lin(x).squeeze(-1) - y) ** 2).mean()

        def inner_loss(self, batch: Any) -> Tensor:
            return self._fit(batch) + 0.5 * (self.log_lam.exp() * self.lin.weight[0] ** 2).sum()

        def outer_loss(self, batch: Any) -> Tensor:
            return self._fit(batch)

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return self.inner_loss(batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.inner_parameters(), lr=0.1)

    train, val = loaders(ridge_data(), 20)  # float64
    cb = HyperOptimizationCallback(every_n_steps=2)
    model = Converts()
    _fit(cb, train, val, model, max_epochs=3)
    assert len(cb.history) > 0 and bool(model.log_lam.ne(0).all())

    # the core, a loss that does not convert: named where it fails, as before
    from hypertorch_sid import SIDConfig, SIDHyperOptimizer

    w, log_lam = torch.zeros(5, requires_grad=True), torch.zeros(5, requires_grad=True)

    def loss(batch: Any) -> Tensor:
        return 0.5 * ((batch[0] @ w - batch[1]) ** 2).mean() + (log_lam.exp() * w**2).sum()

    hopt = SIDHyperOptimizer(
        hyperparameters=[log_lam], inner_parameters=[w], inner_loss=loss, outer_loss=loss,
        outer_optimizer=torch.optim.SGD([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"has dtype torch.float64 but the parameters"):
        hopt.hypergradient(train, next(iter(val)))


def test_a_batchnorm_the_training_keeps_in_eval_mode_is_run_so_in_the_hyper_steps():
    """Linear → BatchNorm whose statistics the user freezes (``self.net[1].eval()`` at each
    epoch's start, as for a pretrained backbone): the hyper steps switched every submodule to
    training mode, so they saw batch statistics the training never uses, and the probe called
    the Linear scale-invariant and held its λ at λ₀ (with frozen statistics it is not: scaling
    it scales the logits). The training's own flags are kept now; a BatchNorm in training mode
    is still probed invariant."""

    class FrozenStatistics(ToyClassifier):
        def __init__(self, freeze: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.freeze = freeze
            self.net = nn.Sequential(
                nn.Linear(D, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, C)
            )

        def on_train_epoch_start(self) -> None:
            if self.freeze:
                self.net[1].eval()

    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    for freeze in (True, False):
        cb = quick_decay()
        _fit(cb, train, toy_val(), FrozenStatistics(freeze), max_epochs=2)
        assert cb.invariant_groups["net.0"] is not freeze


@pytest.mark.parametrize("drop_in", ["decay", "weights"])
def test_trained_tensors_of_two_dtypes_are_named(drop_in):
    """A float64 head on a float32 network (the plain fit runs): refused by the core as
    "inner parameters and hyperparameters have different dtypes (inner_parameters[4]: …,
    hyperparameters[0]: …); convert the model and λ", positions the user never wrote and a λ
    that is the drop-in's own. Named by tensor at fit start, with the fix."""

    class Mixed(ToyClassifier):
        def __init__(self, reduction: str = "mean") -> None:
            super().__init__(reduction)
            self.head = nn.Linear(C, C).double()

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.net(x).double()).float()

    cb, train, net = _drop_in(drop_in, Mixed)
    with pytest.raises(ConfigurationError, match=r"torch.float64: head.weight.*model.float\(\)"):
        _fit(cb, train, toy_val(), net)


def test_a_regression_with_dict_samples_is_recognised():
    """A regression whose samples are dicts (``{"x": …, "y": real target}``): the default
    objective reads a loss as −log p of the right answer and is refused on real-valued targets,
    but the targets were looked for in ``batch[1]`` only, so on dict samples ExpectedError ran
    on squared errors silently. Read where the labels are read now (:func:`batch_labels`)."""

    class DictRegression(Dataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, Tensor]:
            return {"x": X[i], "y": 3.0 * X[i, 0] + 0.5}

    class Regressor(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return (self(batch["x"])[:, 0] - batch["y"]) ** 2

    train = DataLoader(IndexedDataset(DictRegression(len(Y))), batch_size=16)
    val = DataLoader(DictRegression(60), batch_size=20)
    with pytest.raises(ConfigurationError, match=r"validation targets are real numbers"):
        _fit(quick_weights(), train, val, Regressor())
    cb = quick_weights(objective="mean_loss")
    _fit(cb, train, val, Regressor())
    assert len(cb.history) > 0
