"""Careless users, session 61: the data-set wrapper's positions, a standalone map's step α,
training batches with no samples, integer or gradient-free losses, a BilevelModule with nothing
left to train, and one callback's state loaded into another.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Careless inputs (session 61)".
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import (
    QUICK,
    TOY_X,
    TOY_Y,
    Ridge,
    ToyClassifier,
    loaders,
    ridge_data,
    toy_indexed_train,
    toy_train,
    toy_val,
    trainer,
)
from problems import make_ridge
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, Subset, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    ContractionMap,
    DivergenceError,
    GradientDescentMap,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SampleWeights,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core.maps import ProximalGradientMap

X, Y = TOY_X, TOY_Y
SHORT = SIDConfig(inner_steps=5, adjoint_steps=5)


# ------------------------------------------------------------------ IndexedDataset's positions
def test_an_indexed_dataset_position_out_of_range_names_the_position_and_the_length() -> None:
    """ds[10] of 10 rows raised the wrapped set's bare "index 10 is out of bounds for dimension
    0 with size 10" (a list: "list index out of range"), naming neither the wrapper nor what to
    check (session 60's leftover). Still an IndexError: Python's old iteration protocol stops
    on it."""
    ds = IndexedDataset(TensorDataset(X[:10], Y[:10]))
    for i in (10, -11):
        with pytest.raises(IndexError, match=rf"position {i} .*10 examples.*sampler"):
            ds[i]
    listed = IndexedDataset([(1, 2)] * 3)
    with pytest.raises(IndexError, match=r"IndexedDataset: position 3 .*3 examples"):
        listed[3]
    assert len(list(listed)) == 3  # iteration still ends at the IndexError


def test_an_indexed_subset_that_runs_past_its_data_set_is_named() -> None:
    """IndexedDataset(Subset(ds, range(300))) over 240 rows: position 250 raised TensorDataset's
    bare "index 250 is out of bounds for dimension 0 with size 240" from a DataLoader worker."""
    ds = IndexedDataset(Subset(TensorDataset(X, Y), range(300)))
    with pytest.raises(IndexError, match=r"position 250 is within its 300.*Subset raised"):
        ds[250]


def test_an_indexed_dataset_handed_a_list_of_positions_names_batch_sampler() -> None:
    """DataLoader(ds, sampler=BatchSampler(...), batch_size=None) (a known speed-up for a
    TensorDataset) hands the set a list of positions: a raw TypeError "int() argument must be
    ... not 'list'" from inside the wrapper."""
    ds = IndexedDataset(TensorDataset(X[:10], Y[:10]))
    batches = BatchSampler(SequentialSampler(ds), 4, drop_last=False)
    with pytest.raises(ConfigurationError, match=r"one position at a time.*batch_sampler="):
        next(iter(DataLoader(ds, sampler=batches, batch_size=None)))
    with pytest.raises(ConfigurationError, match=r"one position at a time"):
        ds[torch.tensor([1, 2])]


def test_control_a_batch_sampler_given_as_batch_sampler_works() -> None:
    ds = IndexedDataset(TensorDataset(X[:10], Y[:10]))
    batches = BatchSampler(SequentialSampler(ds), 4, drop_last=False)
    first = next(iter(DataLoader(ds, batch_sampler=batches)))
    assert first.index.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("position", [2.0, slice(0, 3)], ids=["float", "slice"])
def test_an_indexed_dataset_position_that_is_no_integer_is_named(position: Any) -> None:
    """ds[2.0] (a position computed as n / 2) raised torch's "only integers, slices ... are
    valid indices (got float)"; ds[0:3] "int() argument must be ... not 'slice'"."""
    ds = IndexedDataset(TensorDataset(X[:10], Y[:10]))
    with pytest.raises(ConfigurationError, match=r"IndexedDataset: a position must be"):
        ds[position]


def test_control_integer_positions_of_numpy_and_torch_are_read() -> None:
    import numpy as np

    ds = IndexedDataset(TensorDataset(X[:10], Y[:10]))
    assert ds[np.int64(3)].index == 3 and ds[torch.tensor(4)].index == 4 and ds[-1].index == 9


# ------------------------------------------------------------------ a standalone map's α
@pytest.mark.parametrize("alpha", [-0.1, 0.0, math.nan, math.inf], ids=["neg", "0", "nan", "inf"])
def test_a_standalone_gradient_map_refuses_a_step_out_of_range(alpha: float) -> None:
    """GradientDescentMap(..., alpha=-0.1) built on its own (for its products or
    estimate_curvature) took any α: Φ̂ = w + 0.1∇ℓ̂ climbs ℓ̂, α = 0 is the identity map, NaN
    poisons every product (session 60's leftover)."""
    p = make_ridge(seed=0)
    with pytest.raises(ConfigurationError, match=r"GradientDescentMap: alpha must be a finite"):
        GradientDescentMap(p.inner_loss, [p.w], [p.log_lam], alpha=alpha)


@pytest.mark.parametrize(
    "alpha, said",
    [
        (True, r"got True"),
        ("0.1", r"the text '0\.1'.*alpha=float\('0\.1'\)"),
        (torch.tensor([0.1, 0.2]), r"a tensor of shape \(2,\)"),
        (torch.tensor(0.1), r"a tensor.*alpha=float\(t\)|alpha=t\.item\(\)"),
    ],
    ids=["bool", "text", "vector", "0-d-tensor"],
)
def test_a_standalone_gradient_map_refuses_a_step_that_is_no_number(alpha: Any, said: str) -> None:
    """True was taken as α = 1.0 and "0.1" as 0.1 (float() of anything); a (2,) tensor raised
    torch's "only one element tensors can be converted to Python scalars"."""
    p = make_ridge(seed=0)
    with pytest.raises(ConfigurationError, match=r"GradientDescentMap: alpha must be.*" + said):
        GradientDescentMap(p.inner_loss, [p.w], [p.log_lam], alpha=alpha)


def test_the_proximal_map_checks_its_step_too() -> None:
    p = make_ridge(seed=0)
    with pytest.raises(ConfigurationError, match=r"ProximalGradientMap: alpha must be"):
        ProximalGradientMap(p.inner_loss, lambda: [p.log_lam.exp()], [p.w], [p.log_lam], -1.0)


def test_a_standalone_map_given_bare_tensors_reads_them_as_one_tensor_each() -> None:
    """GradientDescentMap(loss, p.w, p.log_lam, alpha=0.1) (tensors where lists belong) split
    each into its rows by list(tensor): views no loss reads, so Φ̂ came out as five zeros where
    w − α∇ℓ̂ is [0.121, −0.057, …], silently; the products then failed in autograd. Now a bare
    tensor is one tensor, as SIDHyperOptimizer reads it; no w is refused (no λ is taken: a map
    for its Hessian products alone)."""
    p = make_ridge(seed=0)
    batch = (p.X[:20], p.y[:20])
    listed = GradientDescentMap(p.inner_loss, [p.w], [p.log_lam], alpha=0.1)
    bare = GradientDescentMap(p.inner_loss, p.w, p.log_lam, alpha=0.1)
    assert len(bare.value(batch)) == 1
    assert torch.equal(bare.value(batch)[0], listed.value(batch)[0])
    assert float(listed.value(batch)[0].abs().max()) > 0.05
    with pytest.raises(ConfigurationError, match=r"GradientDescentMap: inner_parameters is empty"):
        GradientDescentMap(p.inner_loss, [], [p.log_lam], alpha=0.1)
    assert GradientDescentMap(p.inner_loss, [p.w], [], alpha=0.1).hyperparameters == []
    with pytest.raises(ConfigurationError, match=r"ContractionMap: inner_parameters\[0\] is a"):
        ContractionMap(lambda b: [p.w], [p.w.tolist()], [p.log_lam])


def test_control_a_standalone_map_keeps_a_valid_step() -> None:
    import numpy as np

    p = make_ridge(seed=0)
    assert GradientDescentMap(p.inner_loss, [p.w], [p.log_lam], alpha=np.float32(0.5)).alpha == 0.5


# ------------------------------------------------------------------ the core's training batches
def test_a_training_batch_with_no_samples_is_refused_by_the_core() -> None:
    """[(X[i:i + 20], y[i:i + 20]) for i in range(0, 220, 20)] over 200 rows ends with an empty
    batch: ℓ̂ on it is the penalty alone (the mean over no rows drops out of the gradient), so
    that inner step shrank w towards 0 with no data, silently (the validation batch was checked
    for this since session 54, the training batches never)."""
    p = make_ridge(seed=0)
    train = [(p.X[i : i + 20], p.y[i : i + 20]) for i in range(0, 220, 20)]
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss,
        torch.optim.Adam([p.log_lam], lr=0.1), config=SHORT,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"train_batches gave a batch with no samples"):
        hopt.step(train, (p.X_val, p.y_val))


# ------------------------------------------------------------------ losses that carry no gradient
def test_an_inner_loss_of_integer_dtype_is_named_by_its_dtype() -> None:
    """An inner_loss returning an integer tensor (a count, .long(), .round().int()) was refused
    as "inner_loss does not depend on the inner parameters (its result does not require grad)",
    which it does: the integer cast cut it."""
    p = make_ridge(seed=0)
    train = [(p.X[i : i + 20], p.y[i : i + 20]) for i in range(0, 200, 20)]
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], lambda b: (100 * p.inner_loss(b)).long(), p.outer_loss,
        torch.optim.Adam([p.log_lam], lr=0.1), config=SHORT,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"inner_loss.*dtype torch\.int64.*no gradient"):
        hopt.step(train, (p.X_val, p.y_val))


class _NoGradStep(ToyClassifier):
    @torch.no_grad()
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch, batch_idx)


class _ErrorCount(ToyClassifier):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self(batch[0]).argmax(1) != batch[1]).sum()


@pytest.mark.parametrize(
    "make, module, train, said",
    [
        (LearnedWeightDecay, _NoGradStep, toy_train, r"does not require grad.*torch\.no_grad\(\)"),
        (LearnedDataWeights, lambda: _NoGradStep("none"), toy_indexed_train, r"torch\.no_grad\(\)"),
        (LearnedWeightDecay, _ErrorCount, toy_train, r"does not require grad.*a count \(of errors"),
    ],
    ids=["decay-no-grad", "weights-no-grad", "decay-error-count"],
)
def test_a_training_loss_without_gradient_is_named_by_the_callback(
    make: Any, module: Any, train: Any, said: str
) -> None:
    """A training_step under @torch.no_grad() (copied from a predict_step), or returning a
    count of errors, failed inside Lightning's backward with torch's "element 0 of tensors
    does not require grad and does not have a grad_fn", naming no step and no cause."""
    cb = make(**QUICK)
    with pytest.raises(ConfigurationError, match=rf"{make.__name__}: training_step.*{said}"):
        trainer([cb], max_epochs=1).fit(module(), train(), toy_val())


# ------------------------------------------------------------------ BilevelModule
class _FrozenWeights(Ridge):
    def __init__(self) -> None:
        super().__init__()
        self.lin.requires_grad_(False)  # meant to hold a layer; here the only one


def test_a_bilevel_module_with_every_weight_frozen_is_named() -> None:
    """With every weight frozen, SGD(self.inner_parameters()) in configure_optimizers raised
    torch's "optimizer got an empty parameter list"."""
    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with pytest.raises(ConfigurationError, match=r"no inner parameter.*lin\.weight.*frozen"):
        trainer([cb], max_epochs=1).fit(_FrozenWeights(), *loaders(ridge_data(), 20))


# ------------------------------------------------------------------ one callback's state in another
def _fitted_decay() -> LearnedWeightDecay:
    cb = LearnedWeightDecay(1e-3, **QUICK)
    trainer([cb], max_epochs=1).fit(ToyClassifier(), toy_train(), toy_val())
    return cb


def _fitted_weights() -> LearnedDataWeights:
    cb = LearnedDataWeights(**QUICK)
    trainer([cb], max_epochs=1).fit(ToyClassifier("none"), toy_indexed_train(), toy_val())
    return cb


def test_a_decay_state_loaded_into_data_weights_is_named_as_the_other_callbacks() -> None:
    """LearnedDataWeights().load_state_dict(decay.state_dict()) (the wrong entry of a
    checkpoint's "callbacks" picked by hand) was refused as "learned with
    parameterization='log' (this run: 'SigmoidWeights')", a setting the user never gave; the
    other way round as "parameterization='SigmoidWeights' (this run: 'log')"."""
    decay, weights = _fitted_decay(), _fitted_weights()
    with pytest.raises(ConfigurationError, match=r"a LearnedWeightDecay state.*LearnedDataWeights"):
        LearnedDataWeights(**QUICK).load_state_dict(decay.state_dict())
    with pytest.raises(ConfigurationError, match=r"a LearnedDataWeights state.*LearnedWeightDecay"):
        LearnedWeightDecay(**QUICK).load_state_dict(weights.state_dict())
    with pytest.raises(ConfigurationError, match=r"a LearnedWeightDecay state.*HyperOptimization"):
        HyperOptimizationCallback(every_n_steps=2).load_state_dict(decay.state_dict())


def test_control_a_decay_state_loads_into_a_decay() -> None:
    decay = _fitted_decay()
    other = LearnedWeightDecay(1e-3, **QUICK)
    other.load_state_dict(decay.state_dict())
    assert other._pending is not None


# ------------------------------------------------------------------ an indexed validation set
def test_an_indexed_validation_set_under_the_decay_is_named() -> None:
    """DataLoader(IndexedDataset(val_set)) beside LearnedWeightDecay (left from a switch to
    LearnedDataWeights) was refused as "training_step failed on one (RuntimeError: mat1 and
    mat2 must have the same dtype ...)": the index read as the input. LearnedDataWeights has
    named the wrapper since session 57; the decay did not."""
    val = DataLoader(IndexedDataset(TensorDataset(X[:60], Y[:60])), batch_size=20)
    cb = LearnedWeightDecay(1e-3, **QUICK)
    with pytest.raises(ConfigurationError, match=r"IndexedDataset.*DataLoader\(val_set\)"):
        trainer([cb], max_epochs=1).fit(ToyClassifier(), toy_train(), val)


# ------------------------------------------------------------------ who speaks
@pytest.mark.parametrize("make", [LearnedWeightDecay, LearnedDataWeights])
@pytest.mark.parametrize(
    "setting",
    [dict(seed=None), dict(every_n_steps=0), dict(val="all"), dict(log_to_loggers="yes")],
    ids=["seed-None", "every-0", "val-all", "loggers-text"],
)
def test_a_drop_ins_own_settings_are_refused_in_its_own_name(
    make: Any, setting: dict[str, Any]
) -> None:
    """LearnedWeightDecay(seed=None) (meant as "no seed"), every_n_steps=0, val="all",
    log_to_loggers="yes" were refused as "HyperOptimizationCallback: seed must be ...", a
    class the user never named (the base class's constructor spoke for the drop-ins); so was
    a state of missing keys ("not a complete HyperOptimizationCallback state")."""
    with pytest.raises(ConfigurationError, match=rf"^{make.__name__}: "):
        make(**setting)
    with pytest.raises(ConfigurationError, match=rf"not a complete {make.__name__} state"):
        make().load_state_dict({"sid": {}})


# ------------------------------------------------------------------ validation classes
class _SixOutputs(ToyClassifier):
    def __init__(self) -> None:
        super().__init__("none")
        self.net[2] = torch.nn.Linear(16, 6)


def _fit_said(cb: LearnedDataWeights, module: Any, val_y: torch.Tensor) -> list[str]:
    val = DataLoader(TensorDataset(X[:60], val_y), batch_size=20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(module, toy_indexed_train(), val)
    return [str(w.message) for w in caught if "which no training label holds" in str(w.message)]


@pytest.mark.parametrize("per", ["class", "sample"])
def test_validation_classes_no_training_label_holds_are_said(per: str) -> None:
    """A validation set numbered by another encoding (here label 5 in it, training labels
    0..2): LearnedDataWeights(per="class", num_classes=3) refused training labels past 2 but
    took validation ones silently; per sample likewise. E asked for a class never trained."""
    val_y = Y[:60].clone()
    val_y[5] = 5
    extra = dict(num_classes=3) if per == "class" else {}
    said = _fit_said(LearnedDataWeights(per=per, **extra, **QUICK), _SixOutputs(), val_y)
    assert len(said) == 1 and "class(es) 5" in said[0]


def test_control_validation_classes_the_training_holds_are_not_said() -> None:
    assert not _fit_said(LearnedDataWeights(**QUICK), _SixOutputs(), Y[:60])


def test_a_state_of_another_object_loaded_into_sample_weights_is_named() -> None:
    """SampleWeights.load_state_dict(hopt.state_dict()) (the optimizer's state, not the
    weights') was refused as "saved sample weights of shape None do not fit these 10 rows: the
    checkpoint belongs to another data set", a wrong cause."""
    p = make_ridge(seed=0)
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss,
        torch.optim.Adam([p.log_lam], lr=0.1), config=SHORT,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"not a SampleWeights state.*'hyper_step'"):
        SampleWeights(10).load_state_dict(hopt.state_dict())


@pytest.mark.parametrize("value", [1, 0.1], ids=["int", "float"])
def test_a_hyperparameter_given_as_a_python_number_is_named_with_the_tensor_to_make(
    value: Any,
) -> None:
    """SIDHyperOptimizer([1], ...) (λ as a Python number) was refused as "hyperparameters[0]
    is a int, not a torch.Tensor", without saying what to pass."""
    p = make_ridge(seed=0)
    with pytest.raises(ConfigurationError, match=r"torch\.tensor\(.*requires_grad=True\)"):
        SIDHyperOptimizer([value], [p.w], p.inner_loss, p.outer_loss, None)


def test_a_nan_training_target_is_named_by_the_preconditioner() -> None:
    """A NaN in one training target (batch 2 of the ridge) made the Fisher preconditioner's
    diagonal NaN, which was read as "no preconditioner": the hyper step ran unpreconditioned
    without a word (the estimated L went from 0.158 to 1.87, ĝ₁ from 0.033 to 0.073), the NaN
    row unnoticed until an inner step drew its batch."""
    p = make_ridge(seed=0)
    train = [(p.X[i : i + 20], p.y[i : i + 20]) for i in range(0, 200, 20)]
    y = train[2][1].clone()
    y[3] = float("nan")
    train[2] = (train[2][0], y)
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss,
        torch.optim.Adam([p.log_lam], lr=0.1), config=SHORT,
    )  # fmt: skip
    before = p.log_lam.detach().clone()
    with pytest.raises(DivergenceError, match=r"FisherDiagonal.*check the training data for NaN"):
        hopt.step(train, (p.X_val, p.y_val))
    assert torch.equal(p.log_lam.detach(), before)


_NAN_X = X.clone()
_NAN_X[100, 2] = float("nan")


@pytest.mark.parametrize(
    "make, train, at",
    [
        (
            lambda: LearnedDataWeights(**QUICK),
            lambda: IndexedDataset(TensorDataset(_NAN_X[60:], Y[60:])),
            40,
        ),
        (
            lambda: LearnedWeightDecay(1e-3, **QUICK),
            lambda: Subset(TensorDataset(_NAN_X, Y), list(range(239, 59, -1))),
            139,
        ),
    ],
    ids=["weights-indexed", "decay-subset"],
)
def test_a_nan_feature_behind_a_wrapper_is_named_as_the_data(
    make: Any, train: Any, at: int
) -> None:
    """A NaN feature in one training row: a bare TensorDataset was named ("the training data
    does: ... index 40"), but behind IndexedDataset (every LearnedDataWeights fit) or a Subset
    (a random_split part) the fit's error blamed the loss: "the training_step returned a
    non-finite loss at step 3 ... the loss itself produced the NaN/Inf". The position named is
    the training position (row 100 of X is position 139 of the reversed Subset)."""
    cb = make()
    module = ToyClassifier("none" if isinstance(cb, LearnedDataWeights) else "mean")
    with pytest.raises(DivergenceError, match=rf"because the training data does.*\(index {at}\)"):
        trainer([cb], max_epochs=1).fit(module, DataLoader(train(), batch_size=16), toy_val())


# ------------------------------------------------------------------ lead: config.inner_steps
@pytest.mark.parametrize("make", ["LearnedWeightDecay", "LearnedDataWeights"])
def test_an_inner_steps_set_in_a_config_given_to_a_callback_is_said_ignored(make):
    """The keyword ``inner_steps=`` is refused; the same inside ``config=SIDConfig(...)`` (one
    shared with a core experiment) was dropped without a word. Now warned; the config's
    default inner_steps (and the callbacks' own config) say nothing."""
    import hypertorch_sid
    from hypertorch_sid.core import SIDConfig

    callback = getattr(hypertorch_sid, make)
    with pytest.warns(UserWarning, match=rf"{make}: config.inner_steps=5 is ignored"):
        callback(config=SIDConfig(inner_steps=5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback(config=SIDConfig(step_size="constant", eta=0.5))
        callback()
