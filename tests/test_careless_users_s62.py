"""Careless users, session 62: a ``configure_optimizers`` without its optimizer, a compute budget
refused in no callback's name, read-outs of a callback no fit has built, per-sample losses under
the decay, a Trainer given no length, a float16 fit of the data weights, a number given as the
step schedule.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Careless inputs (session 62)".
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import (
    QUICK,
    TOY_X,
    TOY_Y,
    ToyClassifier,
    toy_indexed_train,
    toy_train,
    toy_val,
    trainer,
)
from problems import make_ridge

from hypertorch_sid import (
    ConfigurationError,
    HyperOptimizationCallback,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core.lazy_adam import LazyAdam

X, Y = TOY_X, TOY_Y
CALLBACKS = [LearnedWeightDecay, LearnedDataWeights]


# ------------------------------------------------------------------ configure_optimizers' output
class _SchedulerInADict(ToyClassifier):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}


class _MisspeltKey(ToyClassifier):
    def configure_optimizers(self) -> Any:
        return {"optimizers": torch.optim.SGD(self.parameters(), lr=0.1)}


class _SchedulerAlone(ToyClassifier):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [torch.optim.lr_scheduler.StepLR(opt, 1)]


@pytest.mark.parametrize("make", CALLBACKS)
@pytest.mark.parametrize(
    "module, said",
    [
        (_SchedulerInADict, r"keys \['lr_scheduler'\], without 'optimizer'.*scheduler\.optimizer"),
        (_MisspeltKey, r"keys \['optimizers'\], without 'optimizer'"),
        (_SchedulerAlone, r"the learning-rate scheduler StepLR without its optimizer"),
    ],
)
def test_a_configure_optimizers_without_its_optimizer_is_named(make, module, said) -> None:
    """{"lr_scheduler": s} (or a misspelt "optimizers" key) failed with Lightning's bare
    KeyError: 'optimizer' from inside the strategy's setup, a scheduler alone with Lightning's
    list of forms (session 61's leftover (a)). Now named by the callback, with the fix; the
    module's own configure_optimizers is put back after the fit."""
    model = module()
    with pytest.raises(ConfigurationError, match=rf"{make.__name__}: configure_optimizers.*{said}"):
        trainer([make(**QUICK)], max_epochs=1).fit(model, toy_train(), toy_val())
    assert "configure_optimizers" not in model.__dict__


def test_two_callbacks_check_configure_optimizers_once_and_put_it_back() -> None:
    """Both drop-ins in one fit: one check (in the first callback's name), nothing left on the
    module."""
    model = _SchedulerInADict()
    callbacks = [LearnedWeightDecay(**QUICK), LearnedDataWeights(**QUICK)]
    with pytest.raises(ConfigurationError, match=r"^LearnedWeightDecay: configure_optimizers"):
        trainer(callbacks, max_epochs=1).fit(model, toy_indexed_train(), toy_val())
    assert "configure_optimizers" not in model.__dict__


def test_control_a_well_formed_configure_optimizers_is_left_as_it_was() -> None:
    """A dict with its optimizer and scheduler runs; the check leaves no wrapper behind."""

    class Scheduled(ToyClassifier):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    model, cb = Scheduled(), LearnedWeightDecay(**QUICK)
    trainer([cb], max_epochs=1).fit(model, toy_train(), toy_val())
    assert "configure_optimizers" not in model.__dict__
    assert len(cb.learned_weight_decay) == 2


# ------------------------------------------------------------------ max_overhead
@pytest.mark.parametrize(
    "make", [LearnedWeightDecay, LearnedDataWeights, HyperOptimizationCallback]
)
@pytest.mark.parametrize("value", [-1, 0, float("nan"), "fast"])
def test_a_refused_max_overhead_names_the_callback(make, value) -> None:
    """The refusal "max_overhead must be a number > 0 …" named no callback (session 61's
    leftover (b))."""
    with pytest.raises(ConfigurationError, match=rf"^{make.__name__}: max_overhead must be"):
        make(max_overhead=value)


def test_a_percent_like_max_overhead_is_said_once_by_the_data_weights() -> None:
    """LearnedDataWeights(max_overhead=50) built its budget twice (once to choose the cross
    term) and so said the 50×-the-training warning twice."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        LearnedDataWeights(max_overhead=50)
    assert sum("max_overhead=50" in str(w.message) for w in said) == 1


# ------------------------------------------------------------------ read-outs before a fit
@pytest.mark.parametrize(
    "make, read",
    [
        (LearnedWeightDecay, lambda cb: cb.learned_weight_decay),
        (LearnedWeightDecay, lambda cb: cb.effective_weight_decay),
        (LearnedWeightDecay, lambda cb: cb.decay_values()),
        (LearnedDataWeights, lambda cb: cb.data_weights()),
    ],
    ids=["learned_weight_decay", "effective_weight_decay", "decay_values", "data_weights"],
)
def test_a_read_out_of_a_callback_no_fit_built_says_so(make, read) -> None:
    """{} or an empty tensor came back silently from a callback object no fit had used (a
    second LearnedWeightDecay() built to read, or a read before fit), read as "nothing
    learned"; flagged() has said so since session 55."""
    with pytest.warns(UserWarning, match=r"no fit has built .* of this callback object"):
        out = read(make(**QUICK))
    assert len(out) == 0


def test_control_a_fitted_callbacks_read_outs_say_nothing() -> None:
    cb = LearnedWeightDecay(**QUICK)
    trainer([cb], max_epochs=1).fit(ToyClassifier(), toy_train(), toy_val())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        values = cb.decay_values(), cb.learned_weight_decay, cb.effective_weight_decay
    assert all(len(v) > 0 for v in values)
    assert not any("no fit has built" in str(w.message) for w in said)


# ------------------------------------------------------------------ per-sample training losses
def test_per_sample_training_losses_under_the_decay_are_named() -> None:
    """training_step returning F.cross_entropy(..., reduction="none") (kept from a
    LearnedDataWeights fit) failed inside Lightning's backward with torch's "grad can be
    implicitly created only for scalar outputs"."""
    with pytest.raises(ConfigurationError, match=r"loss of shape \(16,\).*losses\.mean\(\)"):
        trainer([LearnedWeightDecay(**QUICK)], max_epochs=1).fit(
            ToyClassifier("none"), toy_train(), toy_val()
        )


# ------------------------------------------------------------------ a Trainer given no length
@pytest.mark.parametrize("length", [dict(max_epochs=0), dict(max_steps=0)], ids=str)
def test_a_fit_given_no_length_says_nothing_was_learned(length) -> None:
    """Trainer(max_epochs=0) or (max_steps=0): no training step, no hyper step, and
    learned_weight_decay gave λ₀ back as learned, without a word."""
    cb = LearnedWeightDecay(**QUICK)
    key = next(iter(length))
    with pytest.warns(UserWarning, match=rf"ran no training step.*{key}=0.*not learned"):
        trainer([cb], **length).fit(ToyClassifier(), toy_train(), toy_val())


# ------------------------------------------------------------------ float16 data weights
def test_data_weights_in_float16_learn_what_float32_learns() -> None:
    """precision="16-true": the drop-in's LazyAdam ran in float16, where a small gradient's
    square and eps=1e-8 are 0, so the first hyper step's rows stepped by 0/0: "the
    hyperparameters diverged … Lower the outer learning rate" (the wrong cause). Its moments are
    now float32: the weights are float32's to 3e-3."""

    def weights(**settings: Any) -> torch.Tensor:
        cb = LearnedDataWeights(**QUICK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer([cb], max_epochs=1, **settings).fit(
                ToyClassifier("none"), toy_indexed_train(), toy_val()
            )
        return cb.data_weights().float()

    full, half = weights(), weights(precision="16-true")
    assert (full - 0.5).abs().max() > 0.1  # they moved
    assert torch.allclose(half, full, atol=3e-3)


def test_lazy_adam_steps_a_float16_row_of_tiny_gradient_finitely() -> None:
    """The core optimizer alone: a float16 row whose gradient squares to 0 moved to inf."""
    p = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    opt = LazyAdam([p], lr=0.1)
    p.grad = torch.tensor([1e-5, 0.0, 1.0], dtype=torch.float16)
    opt.step()
    assert torch.isfinite(p).all()
    assert p[0] < 0 and p[1] == 0 and p[2] < 0


# ------------------------------------------------------------------ the step schedule
def test_a_number_given_as_the_step_schedule_names_eta() -> None:
    """SIDConfig(step_size=0.1): "unknown step_size 0.1: use 'constant', …", not saying that
    the step's size is eta=."""
    with pytest.raises(ConfigurationError, match=r"names the schedule.*eta=0\.1"):
        SIDConfig(step_size=0.1)


# ------------------------------------------------------------------ flagged's threshold
def test_a_flag_threshold_left_a_tensor_is_named_with_item() -> None:
    """flagged(cb.data_weights().quantile(0.1)): a tensor threshold was refused as "the flag
    rule must be 'split', 'below_half' or a FlagRule (e.g. 0.25 …), got tensor(0.3000)", which
    reads as if 0.3 were refused; NumPy numbers are taken."""
    from hypertorch_sid.core.flag_rules import as_flag_rule

    with pytest.raises(ConfigurationError, match=r"flagged: .*a tensor.*rule=t\.item\(\) = 0\.25"):
        as_flag_rule(torch.tensor(0.25))
    with pytest.raises(ConfigurationError, match=r"a tensor of shape \(2,\)"):
        as_flag_rule(torch.tensor([0.25, 0.5]))


# ------------------------------------------------------------------ a dict of settings
@pytest.mark.parametrize(
    "make", [LearnedWeightDecay, LearnedDataWeights, HyperOptimizationCallback]
)
def test_a_dict_of_settings_given_as_the_first_argument_is_named(make) -> None:
    """make(config) with a config file's section: refused as a bad first setting
    ("weight_decay must be a finite number > 0 …, got {'every_n_steps': 4, …}", "per must be
    'sample' or 'class', got {…}"), not saying that it is unpacked with **."""
    with pytest.raises(ConfigurationError, match=rf"{make.__name__}\(\*\*settings\)"):
        make({"every_n_steps": 4, "adjoint_steps": 5})


def test_control_a_dict_of_decays_per_layer_is_still_refused_as_a_decay() -> None:
    with pytest.raises(ConfigurationError, match=r"one starting value for every λ"):
        LearnedWeightDecay({"net.0": 1e-4})


# ------------------------------------------------------------------ λ above the decay applied
class _FallingLr(ToyClassifier):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        tail = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step < 8 else 0.01)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": tail, "interval": "step"}}


@pytest.mark.parametrize(
    "module, said",
    [(ToyClassifier, r"still rising .*had not fallen"), (_FallingLr, r"learning rate was near 0")],
    ids=["constant-lr", "falling-lr"],
)
def test_lambda_above_the_decay_applied_is_blamed_on_the_lr_only_where_it_fell(module, said):
    """The fit's end said "λ ended 18× above the decay the fit applied …: its last rises came
    where the learning rate was near 0" after a 12-step fit at a constant lr 0.1 (λ still
    rising when the fit ended); the lr's fall is now said only where it fell."""
    cb = LearnedWeightDecay(**QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=1).fit(module(), toy_train(), toy_val())
    with torch.no_grad():  # the last λ of one layer 10⁴× up (λ fell over these short fits)
        cb.rho[0][0] += 9.2
    assert re.search(said, cb.problem.ended_above_applied())


# ------------------------------------------------------------------ a tied weight listed twice
class _Tied(ToyClassifier):
    """The toy with a hidden layer whose weight is tied to another's."""

    def __init__(self, listed_twice: bool) -> None:
        super().__init__()
        self.enc, self.dec = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
        self.dec.weight = self.enc.weight
        self.net[0] = torch.nn.Linear(6, 16)
        self.listed_twice = listed_twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.tanh(self.dec(torch.tanh(self.enc(x)))))

    def configure_optimizers(self) -> Any:
        if self.listed_twice:  # enc.weight is dec.weight: in the list twice
            params = [*self.enc.parameters(), *self.dec.parameters(), *self.net.parameters()]
            return torch.optim.SGD(params, lr=0.1)
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_tied_weight_listed_twice_in_the_optimizer_is_refused() -> None:
    """SGD(list(enc.parameters()) + list(dec.parameters())) with dec.weight = enc.weight steps
    the tied tensor twice per step (torch only warns of "duplicate parameters"); the hyper
    steps model one step, and λ was learned for another training, silently."""
    with pytest.raises(ConfigurationError, match=r"lists enc\.weight twice.*self\.parameters\(\)"):
        trainer([LearnedWeightDecay(**QUICK)], max_epochs=1).fit(
            _Tied(True), toy_train(), toy_val()
        )


def test_control_a_tied_weight_listed_once_runs() -> None:
    cb = LearnedWeightDecay(**QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=1).fit(_Tied(False), toy_train(), toy_val())
    assert "enc.weight" in cb.decay_values() and "dec.weight" not in cb.decay_values()


# ------------------------------------------------------------------ the training changed mid-fit
class _ReplacedHead(ToyClassifier):
    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:  # "re-initialise the head" by building a new one
            self.net[2] = torch.nn.Linear(16, 3)


def test_a_layer_replaced_during_the_fit_is_named() -> None:
    """self.net[2] = nn.Linear(...) in a hook: the optimizer kept stepping the old tensors (no
    gradient now), nothing trained the new ones, and the hyper steps went on learning λ for
    the old layer, silently (λ of net.2 fell to 9e-8)."""
    cb = LearnedWeightDecay(**QUICK)
    with pytest.raises(ConfigurationError, match=r"no longer the module's.*net\.2\.weight"):
        trainer([cb], max_epochs=2).fit(_ReplacedHead(), toy_train(), toy_val())


def test_lightning_1_accumulation_schedule_is_named() -> None:
    """Trainer(accumulate_grad_batches={0: 1, 1: 2}) (Lightning 1.x): a raw TypeError
    "unsupported operand type(s) for /: 'int' and 'dict'" from Lightning's
    estimated_stepping_batches, read by the callback's plan of the fit."""
    with pytest.raises(
        ConfigurationError, match=r"GradientAccumulationScheduler\(\{0: 1, 1: 2\}\)"
    ):
        trainer(
            [LearnedWeightDecay(**QUICK)], max_epochs=1, accumulate_grad_batches={0: 1, 1: 2}
        ).fit(ToyClassifier(), toy_train(), toy_val())


def test_an_outer_adam_whose_eps_is_zero_in_float16_is_refused() -> None:
    """LearnedDataWeights(outer_optimizer=partial(torch.optim.Adam, lr=0.1)) under
    precision="16-true": torch's Adam adds eps=1e-8 in float16, where it is 0, and the first
    hyper step failed with "… non-finite λ … Lower the outer learning rate"."""
    import functools

    cb = LearnedDataWeights(outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1), **QUICK)
    with pytest.raises(ConfigurationError, match=r"eps=1e-08.*float16.*eps=1e-08 is 0 too"):
        trainer([cb], max_epochs=1, precision="16-true").fit(
            ToyClassifier("none"), toy_indexed_train(), toy_val()
        )


def test_the_callbacks_default_outer_adam_holds_an_eps_float16_can_hold() -> None:
    """HyperOptimizationCallback's own Adam over a float16 λ (a BilevelModule under
    precision="16-true") kept eps=1e-8, 0 there. Session 63: float16's smallest normal eps was
    not enough (the squares underflow too); the default there is LazyAdam, which steps in
    float32, and torch's Adam (eps=1e-8) elsewhere."""
    cb = HyperOptimizationCallback(**QUICK)
    half = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    full = torch.zeros(3, requires_grad=True)
    assert isinstance(cb._outer_optimizer([half]), LazyAdam)
    assert cb._outer_optimizer([full]).param_groups[0]["eps"] == 1e-8


# ------------------------------------------------------------------ E that is ℓ̂
def test_an_outer_loss_that_is_the_inner_loss_is_said() -> None:
    """outer_loss returning inner_loss(batch) (a copy-paste): E holds the training's penalty,
    whose own gradient pulls λ down whatever the validation data say (the ridge over 30
    epochs: λ ≈ 0.044 against 0.061), silently."""
    p = make_ridge()
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.inner_loss, torch.optim.Adam([p.log_lam], lr=0.1),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"outer_loss equals inner_loss .*penalty"):
        hopt.hypergradient(p.loader(20), p.val())


def test_control_an_outer_loss_without_the_penalty_is_not_said() -> None:
    p = make_ridge()
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss, torch.optim.Adam([p.log_lam], lr=0.1),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hopt.hypergradient(p.loader(20), p.val())
    assert not any("equals inner_loss" in str(w.message) for w in said)
