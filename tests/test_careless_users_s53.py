"""A careless user's inputs that gave silent wrong answers or unclear failures (session 53; the
table of every recipe tried and its outcome is in docs/failures.md, "Careless users (session
53)"). Each test fails without its fix.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_X,
    TOY_Y,
    Ridge,
    ToyClassifier,
    loaders,
    quick_decay,
    quick_weights,
    ridge_data,
    toy_val,
    trainer,
)
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    SIDConfig,
    SIDHyperOptimizer,
)

X, Y = TOY_X, TOY_Y


def _indexed(*tensors: Tensor) -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(*(tensors or (X, Y)))), batch_size=16)


def _fit(cb: Any, train: Any, val: Any, model: Any, ckpt_path: Any = None, **kw: Any) -> None:
    kw.setdefault("max_epochs", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter = trainer(cb if isinstance(cb, list) else [cb], **kw)
        fitter.fit(model, train, val, ckpt_path=ckpt_path)


# ---------------------------------------------------------------- labels
class _Binary(ToyClassifier):
    """Class 0 of the toy against the others, the per-sample BCE (float targets, cast here)."""

    def __init__(self) -> None:
        super().__init__("none")
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(
            self(x).view(-1), y.float().view(-1), reduction="none"
        )


@pytest.mark.parametrize("per", ["sample", "class"])
def test_binary_labels_stored_as_bools_are_read_as_the_labels(per):
    """Binary labels as bools (``y == k``, cast in the step): read as no labels, so the class
    gauge (the default) and every label check were silently off, the weights up to 0.75 off
    the same fit's on integer labels; ``per="class"`` was refused ("class ids stored as
    floats?"). Now read as 0 / 1: the weights equal the integer labels' bit for bit."""
    binary = (Y == 0).long()
    extra = {"per": "class", "num_classes": 2} if per == "class" else {}
    learned = {}
    for y in (binary, binary.bool()):
        cb = quick_weights(**extra)
        _fit(cb, _indexed(X, y), toy_val(y), _Binary())
        learned[y.dtype] = cb.data_weights()
    assert len(learned[torch.long]) == (240 if per == "sample" else 2)
    assert torch.equal(learned[torch.bool], learned[torch.long])


# ---------------------------------------------------------------- a training step's batch
class _EditsItsBatch(ToyClassifier):
    """A ``training_step`` that edits its batch in place (``"scale"``: ``x /= 2``, a
    normalisation; ``"remap"``: ``y[y == 5] = 0``, a label remap that changes nothing here) or
    not (``"copy"``: ``x = x / 2``)."""

    def __init__(self, edit: str) -> None:
        super().__init__("none")
        self.edit = edit

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.edit == "scale":
            x /= 2.0
        elif self.edit == "remap":
            y[y == 5] = 0
        if self.edit != "scale":
            x = x / 2.0
        return F.cross_entropy(self(x), y, reduction="none")


def test_a_training_step_that_edits_its_batch_in_place_runs_with_the_data_weights():
    """``x /= 2`` (or ``y[y == 5] = 0``, ``x.clamp_(...)``) inside ``training_step``: the
    training batches' cross term replays the step on the same batch between the training's
    forward and its backward, so the replay's write reached tensors that backward needs: a
    raw autograd "modified by an inplace operation" error at the first step after the first
    hyper step (before it, the replay also read the halved x again, so its losses were not
    the step's). Now a step seen editing its batch gets copies for every replay, taken
    before it ran: the weights equal those of the step that copies (``x = x / 2``) bit for
    bit."""
    learned = {}
    for edit in ("copy", "scale", "remap"):
        cb = quick_weights()
        _fit(cb, _indexed(), toy_val(), _EditsItsBatch(edit))
        learned[edit] = cb.data_weights()
    assert torch.equal(learned["scale"], learned["copy"])
    assert torch.equal(learned["remap"], learned["copy"])


# ---------------------------------------------------------------- tensors frozen mid-fit
class _FreezeAtEpoch1(pl.Callback):
    def __init__(self, layer: str) -> None:
        self.layer = layer

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            module.get_submodule(self.layer).requires_grad_(False)


class _TwoLayerRidge(Ridge):
    def __init__(self) -> None:
        super().__init__()
        self.lin2 = torch.nn.Linear(5, 1, bias=False, dtype=torch.float64)

    def _fit(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.lin(x).squeeze(-1) + self.lin2(x).squeeze(-1) - y) ** 2).mean()


def test_a_layer_frozen_during_the_fit_is_named_by_every_callback():
    """A layer frozen at epoch 1 by a callback (progressive freezing): ``LearnedWeightDecay``
    named it since session 49; ``LearnedDataWeights`` and ``HyperOptimizationCallback`` failed
    inside autograd at the next hyper step ("One of the differentiated Tensors does not
    require grad"). Now each names the tensors and the fix."""
    frozen = r"net\.0\.weight, net\.0\.bias stopped requiring gradients during the fit"
    with pytest.raises(ConfigurationError, match="LearnedDataWeights: " + frozen):
        _fit(
            [quick_weights(), _FreezeAtEpoch1("net.0")],
            _indexed(),
            toy_val(),
            ToyClassifier("none"),
        )
    train, val = loaders(ridge_data(), 20, 30)
    base = HyperOptimizationCallback(every_n_steps=2, start_step=2)
    with pytest.raises(ConfigurationError, match=r"HyperOptimizationCallback: lin2\.weight stop"):
        _fit([base, _FreezeAtEpoch1("lin2")], train, val, _TwoLayerRidge(), max_epochs=3)


def test_core_tensors_that_stop_requiring_grad_are_named():
    """``SIDHyperOptimizer`` built, then λ (or w) switched off by ``requires_grad_(False)``
    (``model.requires_grad_(False)`` over a module that holds λ too): a raw autograd "One of
    the differentiated Tensors does not require grad" from inside the solve. Now named at the
    next hypergradient, with the fix."""
    X5, y5, Xv, yv = (t.float() for t in ridge_data())
    w = torch.zeros(5, requires_grad=True)
    log_lam = torch.zeros(1, requires_grad=True)

    def fit_loss(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    hopt = SIDHyperOptimizer(
        [log_lam],
        [w],
        lambda b: fit_loss(b) + 0.5 * log_lam.exp().sum() * (w**2).sum(),
        fit_loss,
        torch.optim.Adam([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )
    train = [(X5[i : i + 20], y5[i : i + 20]) for i in range(0, 120, 20)]
    hopt.step(train, (Xv, yv))
    log_lam.requires_grad_(False)
    with pytest.raises(ConfigurationError, match=r"hyperparameters at positions \[0\] no longer"):
        hopt.step(train, (Xv, yv))
    log_lam.requires_grad_(True)
    w.requires_grad_(False)
    with pytest.raises(ConfigurationError, match=r"inner_parameters at positions \[0\] no long"):
        hopt.step(train, (Xv, yv))


class _Dicts(torch.utils.data.Dataset):
    """The toy as dict samples, the label under ``key``."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __len__(self) -> int:
        return len(X)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x": X[i], self.key: Y[i]}


class _DictStep(ToyClassifier):
    def __init__(self, key: str) -> None:
        super().__init__("none")
        self.key = key

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch["x"]), batch[self.key], reduction="none")


def test_labels_under_a_key_the_drop_in_does_not_read_are_said():
    """Dict samples with the label under ``"cls"`` (not one of ``y``, ``label``, ``labels``,
    ``target``, ``targets``): no label was read and nothing said, so the class gauge and the
    label checks were off, the weights 0.73 off the same data's under ``"y"``. Now said at the
    first step, naming the key and ``target=``, with which the weights equal the ``"y"``
    fit's bit for bit."""
    val = DataLoader(_Dicts("cls"), batch_size=20)
    with pytest.warns(
        UserWarning, match=r"labels under 'cls'.*target=lambda batch: batch\['cls'\]"
    ):
        trainer([quick_weights()], max_epochs=1).fit(_DictStep("cls"), _indexed_dicts("cls"), val)
    learned = {}
    for key, cb in (("y", quick_weights()), ("cls", quick_weights(target=lambda b: b["cls"]))):
        _fit(cb, _indexed_dicts(key), DataLoader(_Dicts(key), batch_size=20), _DictStep(key))
        learned[key] = cb.data_weights()
    assert torch.equal(learned["cls"], learned["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the "y" key: not said
        warnings.filterwarnings("ignore", message=".*(LeafSpec|workers|only \\d+ hyper steps)")
        val = DataLoader(_Dicts("y"), batch_size=20)
        trainer([quick_weights()], max_epochs=1).fit(_DictStep("y"), _indexed_dicts("y"), val)


def _indexed_dicts(key: str) -> DataLoader:
    return DataLoader(IndexedDataset(_Dicts(key)), batch_size=16)


# ---------------------------------------------------------------- the user's callables
@pytest.mark.parametrize(
    "build, call",
    [
        (lambda: quick_decay(validation_loss=lambda batch: batch[0].sum()), "validation_loss"),
        (lambda: quick_decay(training_loss=lambda m, b, i: m(b[0]).sum()), "training_loss"),
        (lambda: quick_weights(validation_loss=lambda batch: batch[0].sum(1)), "validation_loss"),
        (lambda: quick_weights(per="class", num_classes=3, target=lambda m, b: b[1]), "target"),
        (
            lambda: HyperOptimizationCallback(outer_optimizer=lambda: torch.optim.SGD([], lr=1)),
            "outer_optimizer",
        ),
    ],
    ids=["decay-validation", "decay-training", "weights-validation", "target", "optimizer"],
)
def test_a_callable_written_for_another_call_is_refused_at_construction(build, call):
    """``validation_loss=lambda batch: ...`` (the drop-ins call ``validation_loss(module,
    batch)``), ``target=lambda module, batch: ...``, ``outer_optimizer=lambda: ...``: taken,
    then a raw "takes 1 positional argument but 2 were given" naming a lambda at the first hyper
    step, after every training step before it. Now refused at construction, naming the call."""
    with pytest.raises(ConfigurationError, match=rf"{call} is called as {call}\("):
        build()
    quick_decay(validation_loss=lambda module, batch: batch[0].sum())  # the right calls are taken
    quick_weights(per="class", num_classes=3, target=lambda batch: batch[1])
    HyperOptimizationCallback(outer_optimizer=torch.optim.Adam)


# ---------------------------------------------------------------- resume
def test_a_resumed_fit_says_a_wipe_that_began_before_its_checkpoint(tmp_path):
    """``LearnedWeightDecay(1.0)`` on session 51's 4-layer MLP (its decay wipes the last hidden
    matrix), the fit checkpointed every epoch and resumed from epoch 2 to its end (a preempted
    job): the straight fit says at its end that net.4.weight was wiped (3.26 → 0.012); the
    resumed one compared with its own start's norm, 0.09 (already wiped), and said nothing.
    The start norms are checkpointed now and the resumed fit says what the straight fit says."""
    from pytorch_lightning.callbacks import ModelCheckpoint
    from test_careless_users_s51 import DeepNet

    train = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)
    torch.manual_seed(0)
    every_epoch = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)
    _fit([quick_decay(weight_decay=1.0), every_epoch], train, toy_val(), DeepNet(), max_epochs=4,
         enable_checkpointing=True)  # fmt: skip
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resumed = trainer([quick_decay(weight_decay=1.0)], max_epochs=4)
        resumed.fit(DeepNet(), train, toy_val(), ckpt_path=str(tmp_path / "epoch=1-step=30.ckpt"))
    wiped = [str(w.message) for w in said if "wiped" in str(w.message)]
    assert len(wiped) == 1 and "net.4.weight fell from 3.26 at the fit's start" in wiped[0]


@pytest.mark.parametrize("which", ["num_classes", "apply_to"])
def test_a_resume_under_another_count_of_slots_names_the_setting(tmp_path, which):
    """A ``LearnedDataWeights(per="class", num_classes=3)`` checkpoint resumed with
    ``num_classes=4``, a ``LearnedWeightDecay(granularity="per_tensor", apply_to="weights")``
    one with ``apply_to="all"``: "the saved hyperparameters have shapes [(3,)], these have
    [(4,)]: the checkpoint is truncated or belongs to another model", which it is not. Now the
    setting is named with both values (the drop-ins' checkpointed settings)."""
    if which == "num_classes":
        first, again = (quick_weights(per="class", num_classes=n) for n in (3, 4))
        train, model = _indexed(), lambda: ToyClassifier("none")
    else:
        first = quick_decay(granularity="per_tensor", apply_to="weights")
        again = quick_decay(granularity="per_tensor", apply_to="all")
        train, model = DataLoader(TensorDataset(X, Y), batch_size=16), lambda: ToyClassifier()
    fitted = trainer([first], max_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted.fit(model(), train, toy_val())
    fitted.save_checkpoint(tmp_path / "one.ckpt")
    expected = (
        r"num_classes='3' \(this run: '4'\)" if which == "num_classes" else "apply_to='weights'"
    )
    with pytest.raises(ConfigurationError, match=rf"learned with {expected}"):
        _fit(again, train, toy_val(), model(), ckpt_path=str(tmp_path / "one.ckpt"))


# ---------------------------------------------------------------- the core's settings
def test_raise_on_divergence_with_negative_retries_is_refused():
    """``RaiseOnDivergence(retries=-1)`` was taken, and the first hypergradient ran no attempt:
    a raw ``AssertionError: unreachable``. Refused at construction now, as ``Recover(-1)`` and
    ``BackOff(-1)`` were."""
    from hypertorch_sid import RaiseOnDivergence

    with pytest.raises(ConfigurationError, match=r"RaiseOnDivergence\.retries must be an integer"):
        RaiseOnDivergence(retries=-1)
    assert RaiseOnDivergence().retries == 0


# ---------------------------------------------------------------- reading the weights
def test_a_flag_threshold_that_flags_every_row_or_none_is_refused():
    """``flagged(50)`` (a percentage) or ``flagged(1.0)`` under the sigmoid (ω < 1 always)
    returned every one of the 240 rows; ``flagged(float("nan"))``, ``flagged(-1)``,
    ``flagged(0)`` returned none: whatever was learned. Refused now, naming a weight as the
    fix; thresholds inside the weights' range flag as before (softmax weights, which average
    1, take thresholds above 1)."""
    cb = quick_weights()
    _fit(cb, _indexed(), toy_val(), ToyClassifier("none"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flags' own evidence warnings
        assert 0 < len(cb.flagged(0.5)) < 240
        for every in (50, 1.0):
            with pytest.raises(ConfigurationError, match="flags every row.*not a percentage"):
                cb.flagged(every)
        for none in (float("nan"), -1, 0):
            with pytest.raises(ConfigurationError, match="threshold must be a finite number > 0"):
                cb.flagged(none)
        softmax = quick_weights(parameterization="softmax")
        _fit(softmax, _indexed(), toy_val(), ToyClassifier("none"))
        assert 0 < len(softmax.flagged(2.0)) < 240


CLASSES = ["ant", "bee", "cat"]


class _Named(torch.utils.data.Dataset):
    """The toy with each label a class name (a string)."""

    def __init__(self, rows: int = len(X)) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> tuple[Tensor, str]:
        return X[i], CLASSES[int(Y[i])]


class _NamedStep(ToyClassifier):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, names = batch
        y = torch.tensor([CLASSES.index(c) for c in names])
        return F.cross_entropy(self(x), y, reduction="none")


def test_class_names_as_labels_are_said_with_their_fix():
    """Labels as class names (strings, mapped to ids in the step): per sample no label was
    read, silently (the class gauge and the label checks off: the weights 0.76 off the integer
    labels' fit); ``per="class"`` named "one-hot or soft labels?" and ``batch[1].argmax(1)``,
    which a tuple of strings has not. Now said, naming ``target=`` mapping names to ids, with
    which the weights equal the integer fit's bit for bit."""
    names = DataLoader(IndexedDataset(_Named()), batch_size=16)
    named_val = DataLoader(_Named(60), batch_size=20)
    with pytest.warns(UserWarning, match=r"labels as class names \(strings\).*CLASSES\.index"):
        trainer([quick_weights()], max_epochs=1).fit(_NamedStep("none"), names, named_val)
    with pytest.raises(ConfigurationError, match=r"\(class names\?\).*CLASSES\.index"):
        _fit(quick_weights(per="class", num_classes=3), names, named_val, _NamedStep("none"))
    cb = quick_weights(target=lambda b: torch.tensor([CLASSES.index(c) for c in b[1]]))
    _fit(cb, names, named_val, _NamedStep("none"))
    ids = quick_weights()
    _fit(ids, _indexed(), toy_val(), ToyClassifier("none"))
    assert torch.equal(cb.data_weights(), ids.data_weights())


def test_an_infinite_outer_learning_rate_is_refused_at_construction():
    """``LearnedDataWeights(outer_lr=float("inf"))`` was taken (its ``LazyAdam`` checked
    lr > 0 only): the training batches' cross term wrote σ(±inf) into the rows it moved (a
    weight of exactly 1.0 left in ``data_weights()``) before the first hyper step failed with
    "non-finite λ ... lower the outer learning rate". Refused at construction now."""
    with pytest.raises(ConfigurationError, match="lr must be > 0 and finite, got inf"):
        LearnedDataWeights(outer_lr=float("inf"))
    LearnedDataWeights(outer_lr=2.0)


def test_shared_loss_weights_with_beta1_of_1_are_refused():
    """``LearnedDataWeights(parameterization=SharedLossWeights(betas=(1.0, 0.9)))``: θ's own
    ``LazyAdam`` group divides by 1 − β₁ᵗ = 0; the first hyper step failed with "non-finite λ
    ... Lower the outer learning rate", a fix that does not help. Refused at construction now,
    as the drop-in's own ``outer_betas`` are."""
    from hypertorch_sid import SharedLossWeights

    with pytest.raises(ConfigurationError, match=r"SharedLossWeights: .*betas must be two"):
        SharedLossWeights(betas=(1.0, 0.9))
    assert SharedLossWeights(betas=[0.5, 0.9]).betas == (0.5, 0.9)


# ---------------------------------------------------------------- lead, session 53
def test_an_outer_optimizer_that_decays_the_hyperparameters_is_refused():
    """``outer_optimizer=functools.partial(torch.optim.AdamW, lr=0.1)`` (AdamW's default
    weight_decay=0.01): every outer step decayed log λ toward 0 (λ toward 1), a pull the
    hypergradient does not see, without a word. Refused, in the core and through a callback."""
    import functools

    w, lam = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"AdamW has weight_decay=0.01.*weight_decay=0"):
        SIDHyperOptimizer(
            [lam], [w], lambda b: (lam.exp() * w**2).sum(), lambda b: w.sum(),
            torch.optim.AdamW([lam], lr=0.1),
        )  # fmt: skip
    SIDHyperOptimizer(  # weight_decay=0 is fine
        [lam], [w], lambda b: (lam.exp() * w**2).sum(), lambda b: w.sum(),
        torch.optim.AdamW([lam], lr=0.1, weight_decay=0.0),
    )  # fmt: skip
    decaying = functools.partial(torch.optim.AdamW, lr=0.1)
    train, val = loaders(ridge_data(), 20)
    with pytest.raises(ConfigurationError, match=r"outer_optimizer AdamW has weight_decay"):
        _fit(
            HyperOptimizationCallback(every_n_steps=2, outer_optimizer=decaying),
            train,
            val,
            Ridge(),
        )
