"""The overhead budget (eq. budget) holds, counted in products against the plan, never timed.

The budget reads cost from a clock; here the clock counts work: one unit per training step, and
in the Lightning fit two per Hessian–vector product (adjoint and curvature) and one per
validation gradient, read from the core's own counters (``sid.cost``).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import RidgeData, TanhRegressor

import hypertorch_sid.lightning.callback as callback_module
import hypertorch_sid.lightning.invariance as invariance_module
from hypertorch_sid import ConfigurationError, EstimatedCurvature, LearnedWeightDecay
from hypertorch_sid.core.budget import (
    Deadline,
    HyperWork,
    NoBudget,
    OverheadBudget,
    PacedBudget,
    PlannedBudget,
    make_budget,
)
from hypertorch_sid.core.scale import MAX_FORWARDS


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _simulate(budget: OverheadBudget, clock: _Clock, steps: int, costs) -> list[int]:
    """A training loop: each step costs 1, a hyper step is due after every step and costs
    ``costs(i)`` (the i-th hyper step). The steps at which hyper steps ran."""
    ran = []
    for step in range(1, steps + 1):
        clock.now += 1.0
        budget.training_step_done()
        if budget.allows():
            budget.start_hyper_step()
            clock.now += costs(len(ran))
            budget.end_hyper_step()
            ran.append(step)
    return ran


def test_the_budget_spaces_hyper_steps_to_its_share_of_the_training():
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    ran = _simulate(budget, clock, 400, lambda i: 4.0)
    assert ran[0] == 1  # the first runs at once, then is paid back
    assert budget.spent_training == 399.0 and budget.spent_hyper == 4.0 * len(ran)
    # eq. budget before every hyper step, so at the end: at most one hyper step over the share
    assert budget.spent_hyper <= 0.5 * budget.spent_training + 4.0
    assert len(ran) >= 0.5 * 399 / 4 - 1  # and it spends what it may (≈ one every 8 steps)
    gaps = [b - a for a, b in zip(ran, ran[1:])]
    assert set(gaps) == {8}  # each hyper step paid back (4 / 0.5 steps) before the next one
    assert math.isclose(budget.overhead, 4.0 * len(ran) / 399)


def test_where_the_fits_length_is_known_its_final_share_stays_within_the_budget():
    """The last hyper steps wait unless the remaining steps can pay them back: at the end of the
    fit the share is at most max_overhead (not max_overhead + one hyper step), and the budget is
    still spent (hyper steps every 8 steps, as without the end-of-fit rule)."""
    clock, steps = _Clock(), 400
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()  # the fit starts
    ran = []
    for step in range(1, steps + 1):
        clock.now += 1.0
        budget.training_step_done()
        if budget.allows(remaining_steps=steps - step):
            budget.start_hyper_step()
            clock.now += 12.0 if not ran else 4.0  # the first is dearer (its curvature estimate)
            budget.end_hyper_step()
            ran.append(step)
    assert budget.training_steps == steps and budget.spent_training == steps
    assert budget.spent_hyper <= 0.5 * steps  # the final share, with no slack
    assert budget.spent_hyper >= 0.5 * steps - 4.0  # spent up to one hyper step
    assert ran[-1] < steps and budget.last_hyper == 4.0


def test_a_dearer_hyper_step_delays_the_next_ones():
    """A curvature refresh every 10th hyper step (20 units instead of 4): the credit it overdrew
    is paid back before the next hyper step; the share still holds."""
    clock = _Clock()
    budget = OverheadBudget(0.25, clock=clock)
    ran = _simulate(budget, clock, 2000, lambda i: 20.0 if i % 10 == 0 else 4.0)
    assert budget.spent_hyper <= 0.25 * budget.spent_training + 20.0
    assert budget.overhead > 0.2
    i = 10  # the 11th hyper step is dear: the gap after it is longer than the one before it
    assert ran[i + 1] - ran[i] > ran[i] - ran[i - 1]


def test_no_budget_and_bad_values():
    assert isinstance(make_budget(None), NoBudget) and NoBudget().allows()
    assert math.isnan(NoBudget().overhead)
    assert make_budget(0.3).max_overhead == 0.3 and isinstance(make_budget(0.3), OverheadBudget)
    custom = OverheadBudget(1.0)
    assert make_budget(custom) is custom
    for bad in (0, -0.5, float("nan"), "0.5", True):
        with pytest.raises(ConfigurationError, match="max_overhead must be a number > 0"):
            OverheadBudget(bad)  # type: ignore[arg-type]


def _Net() -> TanhRegressor:
    return TanhRegressor(hidden=8, seed=3)


class _StopAt(pl.Callback):
    """Ends the fit after ``steps`` optimizer steps, as early stopping would (length unknown)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.global_step >= self.steps


def _fit_counting(
    max_overhead: float | None, **trainer_kw
) -> tuple[LearnedWeightDecay, float, float, float]:
    """A fit with a hyper step due after every optimizer step; returns the callback, the
    counted units of the training, of the hyper steps, and of the dearest hyper step."""
    state: dict = {}

    def hyper_units() -> float:
        sid = state["cb"].sid
        if sid is None:
            return 0.0
        c = sid.cost
        return 2.0 * (c.jacobian_vector_products + c.curvature_products) + c.hypergradients

    def clock() -> float:
        return float(state["trainer"].global_step) + hyper_units()

    budget = None if max_overhead is None else OverheadBudget(max_overhead, clock=clock)
    cb = LearnedWeightDecay(1e-2, every_n_steps=1, max_overhead=budget)
    trainer_kw.setdefault("max_epochs", 40)
    extra = trainer_kw.pop("callbacks", [])
    trainer = lightning_problems.trainer([cb, *extra], limit_val_batches=0, **trainer_kw)
    state.update(cb=cb, trainer=trainer)
    dearest = [0.0]
    original = cb._hyper_step

    def hyper_step(trainer, module):
        before = hyper_units()
        original(trainer, module)
        dearest[0] = max(dearest[0], hyper_units() - before)

    cb._hyper_step = hyper_step
    trainer.fit(_Net(), datamodule=RidgeData())
    return cb, float(trainer.global_step), hyper_units(), dearest[0]


def test_the_callback_keeps_the_budget_counted_in_products():
    """max_overhead=0.5 on a small MLP, a hyper step due at every step (unbudgeted: several
    times the training's own products): the products of the hyper steps stay within half of
    the training's, give or take the one hyper step the budget pays back, and the budget's own
    accounting agrees with the counters."""
    cb, train, hyper, dearest = _fit_counting(0.5)
    assert cb.sid.cost.hypergradients >= 3
    assert hyper <= 0.5 * train + dearest
    assert hyper >= 0.5 * train - 2 * dearest  # it spends its budget, not much less
    budget = cb.budget
    assert math.isclose(budget.spent_hyper, hyper) and budget.spent_training == train  # from step 0
    assert budget.skipped > 0 and budget.hyper_steps == cb.sid.cost.hypergradients
    assert "hyper/overhead" in cb.history[-1]

    free, train_free, hyper_free, _ = _fit_counting(None)
    assert hyper_free > 2 * train_free  # what the budget saved
    assert free.sid.cost.hypergradients == train_free
    assert "hyper/overhead" not in free.history[-1]


def test_a_fit_of_unknown_length_is_planned_as_one_of_its_expected_length(monkeypatch):
    """The same fit of N steps, its length known (max_steps=N) or not (max_epochs=-1, ended by a
    callback at N): the budget is told the horizon's R (the steps left; unknown: Gott's estimate,
    the steps run so far, never None), runs as many hyper steps within the two that estimate's
    error at the fit's ends allows, and stays within its share as the known one does."""
    told: list[tuple[int | None, int]] = []
    allows = OverheadBudget.allows

    def recording(self, remaining_steps=None, products=0, due_left=None):
        told.append((remaining_steps, self.training_steps))
        return allows(self, remaining_steps, products, due_left)

    monkeypatch.setattr(OverheadBudget, "allows", recording)
    known, train, hyper, dearest = _fit_counting(0.5, max_steps=120)
    assert all(r == 120 - t for r, t in told)  # the steps left after the t run
    told.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unknown length's warning
        unknown, train_u, hyper_u, dearest_u = _fit_counting(
            0.5, max_epochs=-1, callbacks=[_StopAt(120)]
        )
    assert told and all(r == t for r, t in told)  # the steps run
    assert train == train_u == 120
    n_known, n_unknown = known.budget.hyper_steps, unknown.budget.hyper_steps
    assert n_known >= 3 and abs(n_unknown - n_known) <= 2
    assert hyper_u <= 0.5 * train_u + dearest_u and hyper_u >= 0.5 * train_u - 2 * dearest_u


def test_under_ddp_rank_0_decides_for_every_rank():
    """Each rank measures its own times; a hyper step has collectives, so every rank must run it
    or none: the decision is rank 0's, broadcast."""

    class Strategy:
        def broadcast(self, obj, src=0):
            assert src == 0
            return True  # rank 0's budget allowed it

    class Trainer:
        strategy = Strategy()
        estimated_stepping_batches, global_step, callbacks = 100, 10, []

    cb = LearnedWeightDecay(1e-2, max_overhead=0.5)
    clock = _Clock()
    cb.budget = OverheadBudget(0.5, clock=clock)
    cb.budget.spent_hyper, cb.budget.hyper_steps = 10.0, 1  # this rank's credit is overdrawn
    cb.budget.product_cost = 1.0  # measured
    cb.sid, cb.data = SimpleNamespace(minimum_products=lambda: 3), object()
    assert not cb._budget_allows(Trainer(), None)  # one process: its own decision
    cb._world_size = 2
    assert cb._budget_allows(Trainer(), None)


def test_the_callbacks_own_work_is_charged_to_it_not_to_the_training():
    """Work the callback adds between training steps (applying λ, the step-size probe) counts as
    overhead and is taken out of the training's time."""
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()
    clock.now += 1.0  # training
    with budget.added_work():
        clock.now += 0.25  # the callback's
    clock.now += 1.0  # training
    budget.training_step_done()
    assert budget.spent_training == 2.0 and budget.spent_hyper == budget.spent_added == 0.25
    assert budget.hyper_steps == 0 and budget.overhead == 0.125


def test_another_callbacks_hyper_work_is_not_training():
    """Two callbacks in one fit: a budget and a callback without one (the data weights beside
    the decay). The other's hyper steps and added work, run between the budget's training steps,
    are left out of its training through the shared :class:`HyperWork`; work nested in another
    callback's hyper step counts once. Without sharing they count as training (four times it)."""
    for shared in (True, False):
        clock = _Clock()
        budget, other = OverheadBudget(0.5, clock=clock), NoBudget()
        if shared:
            work = HyperWork(clock)
            budget.share_work(work)
            other.share_work(work)
        budget.training_step_done()
        for _ in range(10):
            clock.now += 1.0  # training
            other.start_hyper_step()
            clock.now += 2.0
            with other.added_work():  # nested: counted once
                clock.now += 0.5
            other.end_hyper_step()
            with other.added_work():
                clock.now += 0.5
            budget.training_step_done()
        if shared:
            assert budget.spent_training == 10.0 and work.spent == 30.0
            assert budget.spent_hyper == 0.0 and other.clock is clock
        else:
            assert budget.spent_training == 40.0


def test_a_budget_joins_shared_work_only_on_its_own_clock():
    """Readings of two clocks do not mix: a budget given another clock keeps its own work."""
    mine, theirs = _Clock(), _Clock()
    budget, work = OverheadBudget(0.5, clock=mine), HyperWork(theirs)
    budget.share_work(work)
    assert budget.work is not work and budget.work.clock is mine
    budget.share_work(HyperWork(mine))
    assert budget.work.clock is mine and budget.work is not work


def test_the_work_added_at_every_step_is_reserved_for_the_steps_that_remain():
    """Applying λ costs 0.2 a step, every step to the end of a 100-step fit. A hyper step at
    step 20 that spends its whole allowance (a long curvature estimate) may only take what the
    remaining steps pay back beyond that work: the final share, the per-step work included,
    stays within the budget (without the reservation: 66 of 50)."""
    clock, steps = _Clock(), 100
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()
    for step in range(1, steps + 1):
        with budget.added_work(every_step=True):
            clock.now += 0.2  # λ applied to the gradients
        clock.now += 1.0
        budget.training_step_done()
        if step == 20:
            deadline = budget.allowance(remaining_steps=steps - step)
            budget.start_hyper_step()
            clock.now = deadline.end  # spends all it was allowed
            budget.end_hyper_step()
            assert math.isclose(budget.last_hyper, 6.0 + 80 * (0.5 - 0.2))
    assert math.isclose(budget.spent_training, steps)
    assert math.isclose(budget.spent_per_step, 0.2 * steps)
    assert budget.spent_hyper <= 0.5 * budget.spent_training + 1e-9  # per-step work included


def test_one_off_work_is_not_reserved_from_the_steps_that_remain():
    """Timing a product before the first hyper step (5 units, once) is the callback's work but
    not work every remaining step adds: reserving it from each of them (as the budget did) cut a
    short fit's allowance, here by 5 · 80 / 20 = 20 of 46 units."""
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()
    for _step in range(1, 21):
        with budget.added_work(every_step=True):
            clock.now += 0.2  # λ applied to the gradients
        clock.now += 1.0
        budget.training_step_done()
    with budget.added_work():
        clock.now += 5.0  # one product timed, once
    assert math.isclose(budget.spent_added, 0.2 * 20 + 5.0)
    budget.training_step_done()  # (no training between: nothing counted as training)
    assert math.isclose(budget.spent_per_step, 0.2 * 20) and budget.training_steps == 21
    credit = 0.5 * 20 - (0.2 * 20 + 5.0)
    assert math.isclose(budget.ceiling(80), credit + 80 * (0.5 * 20 / 21 - 0.2 * 20 / 21))


def test_one_off_work_nested_in_the_work_of_every_step_stays_one_off():
    """A hook that runs at every step (0.2) holding a one-off piece (5, timing a product): the
    hook's own 0.2 is reserved from the steps that remain, the 5 is charged once; the total is
    charged once, not twice."""
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()
    clock.now += 1.0
    budget.training_step_done()
    with budget.added_work(every_step=True):
        clock.now += 0.1
        with budget.added_work():
            clock.now += 5.0
        clock.now += 0.1
    clock.now += 1.0
    budget.training_step_done()
    assert math.isclose(budget.spent_added, 5.2) and math.isclose(budget.spent_hyper, 5.2)
    assert math.isclose(budget.spent_per_step, 0.2) and budget.spent_training == 2.0


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget])
def test_the_callbacks_work_at_every_step_is_charged_and_planned_for(budget_cls, monkeypatch):
    """The callback's hooks cost something at every training step besides the hyper steps:
    applying λ (here 0.25 of a training step) and deciding whether a hyper step is due and
    allowed (0.1). Counted, not timed: all of it is charged to the callback (not to the training,
    which it inflated — the budget then granted half of it again as allowance), reserved from what
    the remaining steps pay back, and the fit's final share, that work included, stays within
    max_overhead on the drop-in's defaults."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(192, 1, 8, 8, generator=g), torch.randint(0, 3, (192,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:128], y[:128]), 16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[128:], y[128:]), 32)
    cb, hooks = LearnedWeightDecay(1e-3), {"apply": 0, "decide": 0, "read": 0}

    def units() -> float:
        c = cb.sid.cost if cb.sid is not None else None
        products = 0.0 if c is None else c.jacobian_vector_products + c.curvature_products
        hook_work = 0.25 * hooks["apply"] + 0.1 * hooks["decide"] + 0.5 * hooks["read"]
        return 1.5 * products + hook_work

    def counted(name, f):
        def g(*args):
            hooks[name] += 1
            return f(*args)

        return g

    cb.problem.apply = counted("apply", cb.problem.apply)
    cb._due = counted("decide", cb._due)
    # reading the training's step size before a due hyper step (Adam's v̂: dear on a big layer)
    # is once per hyper step, not reserved from every remaining step
    monkeypatch.setattr(
        callback_module, "effective_step_size", counted("read", callback_module.effective_step_size)
    )
    cb.budget = budget_cls(0.5, clock=lambda: float(trainer.global_step) + units())
    steps = 400
    trainer = lightning_problems.trainer([cb], max_steps=steps, limit_val_batches=0)
    trainer.fit(_SmallNet("cnn_bn"), loader, val)
    budget = cb.budget
    assert hooks["apply"] == hooks["decide"] == steps and hooks["read"] >= 19
    # the training's own steps, nothing of the callback's
    assert math.isclose(budget.spent_training, steps)
    assert math.isclose(budget.spent_per_step, 0.35 * steps)
    assert budget.hyper_steps >= 3
    assert budget.spent_hyper <= 0.5 * steps + 1e-9  # per-step work included: no slack


def test_the_drop_in_has_a_budget_by_default_and_the_general_callback_none():
    """LearnedWeightDecay() holds its hyper steps to half of the training's compute (chosen by
    measurement: no worse on any of five settings over nine seeds); max_overhead=None restores
    every due hyper step (bit-repeatable fits). The general callback's default is no budget, and
    per element's too (its every-step λ costs starved its hyper steps under 0.5); explicit wins."""
    from hypertorch_sid import HyperOptimizationCallback

    assert LearnedWeightDecay().budget.max_overhead == 0.5
    assert isinstance(LearnedWeightDecay().budget, OverheadBudget)  # PlannedBudget: an option
    for elements in ("tied", "untied", "shrunk"):
        per_element = LearnedWeightDecay(granularity="per_element", elements=elements)
        assert isinstance(per_element.budget, NoBudget)
    explicit = LearnedWeightDecay(granularity="per_element", max_overhead=0.5)
    assert explicit.budget.max_overhead == 0.5
    assert isinstance(LearnedWeightDecay(max_overhead=None).budget, NoBudget)
    assert LearnedWeightDecay(max_overhead=0.3).budget.max_overhead == 0.3
    assert isinstance(HyperOptimizationCallback().budget, NoBudget)


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget])
def test_a_fit_whose_budget_allows_no_hyper_step_says_so(budget_cls):
    """A product costs 30 training steps: no hyper step of a 100-step fit fits in the default
    budget. λ is not learned, and the fit says so at its end, naming max_overhead and the
    fixes, instead of ending silently at the initial λ."""
    with pytest.warns(
        UserWarning, match=r"allowed none of the 5 hyper steps due.*max_overhead=None"
    ):
        cb, ran = _priced_fit(per_hvp=30.0, steps=100, budget_cls=budget_cls)
    assert ran == [] and not cb.history
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*allowed none of the.*")
        cb, ran = _priced_fit(per_hvp=1.0, steps=40, budget_cls=budget_cls)  # pays for one
    assert len(ran) >= 1


def _counting_fit(cb: LearnedWeightDecay, epochs: int, ckpt=None) -> pl.Trainer:
    """A fit whose budget clock counts products (as in :func:`_fit_counting`), those made in
    this fit: the core's counters come back from the checkpoint at the build."""
    offset: list[float] = []

    def clock() -> float:
        if cb.sid is None:
            return float(trainer.global_step)
        c = cb.sid.cost
        products = 2.0 * (c.jacobian_vector_products + c.curvature_products)
        if not offset:
            offset.append(products)
        return float(trainer.global_step) + products - offset[0]

    cb.budget = OverheadBudget(0.5, clock=clock)
    trainer = lightning_problems.trainer([cb], max_epochs=epochs, limit_val_batches=0)
    trainer.fit(_Net(), datamodule=RidgeData(), ckpt_path=ckpt)
    return trainer


def test_a_resumed_fit_keeps_the_budgets_accounting(tmp_path):
    """The budget's accounting is in the callback's checkpointed state: a resumed fit continues
    it (it used to start afresh, and so could spend the budget twice). A hyper step skipped for
    a diverged solve is the budget's (its time was spent), not the core's (no hypergradient)."""
    first = LearnedWeightDecay(1e-2, every_n_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _counting_fit(first, 20)
    saved = first.budget.state_dict()
    assert saved["hyper_steps"] >= 2 and saved["spent_training"] > 0
    assert first.state_dict()["budget"] == saved
    trainer.save_checkpoint(tmp_path / "half.ckpt")

    resumed = LearnedWeightDecay(1e-2, every_n_steps=1)
    with warnings.catch_warnings(record=True) as more:
        warnings.simplefilter("always")
        _counting_fit(resumed, 40, ckpt=tmp_path / "half.ckpt")
    budget = resumed.budget
    assert budget.hyper_steps > saved["hyper_steps"]  # continued, not restarted
    assert budget.spent_training > saved["spent_training"]
    assert budget.spent_hyper > saved["spent_hyper"]
    skipped = sum("hyper step skipped" in str(w.message) for w in [*caught, *more])
    # the same count as the core's, but for the skipped hyper steps
    assert budget.hyper_steps == resumed.sid.cost.hypergradients + skipped


@pytest.mark.parametrize(
    "bad", [{"spent_hyper": -1.0}, {"spent_training": float("nan")}, {"foreign": 1.0}, [1.0]]
)
def test_a_corrupted_budget_state_is_refused(bad):
    with pytest.raises(ConfigurationError, match="budget state must be a dict of finite"):
        OverheadBudget(0.5).load_state_dict(bad)


def test_a_bad_max_overhead_names_the_fix():
    with pytest.raises(ConfigurationError, match=r"max_overhead must be a number > 0.*None"):
        LearnedWeightDecay(1e-2, max_overhead=-1)


class _SmallNet(pl.LightningModule):
    """A CNN with BatchNorm or an LSTM on 8×8 inputs (rows as a sequence), Adam."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        if kind == "cnn_bn":
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                torch.nn.Flatten(), torch.nn.Linear(4 * 64, 3),
            )  # fmt: skip
        else:
            self.lstm, self.head = torch.nn.LSTM(8, 8, batch_first=True), torch.nn.Linear(8, 3)

    def forward(self, x):
        if self.kind == "cnn_bn":
            return self.body(x)
        out, _ = self.lstm(x.squeeze(1))
        return self.head(out[:, -1])

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget, PacedBudget])
@pytest.mark.parametrize("kind", ["cnn_bn", "lstm"])
def test_the_budget_holds_on_small_networks_counted_in_products(kind, budget_cls):
    """On a CNN with BatchNorm and an LSTM, a hyper step due at every step and the drop-in's
    curvature estimates: counted in products (a training step 1, an HVP 2 for the LSTM's dearer
    double backward, 1.5 for the CNN; a validation gradient 1), what the hyper steps spent stays
    within max_overhead of the training, give or take the dearest hyper step."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(192, 1, 8, 8, generator=g), torch.randint(0, 3, (192,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:128], y[:128]), 16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[128:], y[128:]), 32)
    per_hvp = 2.0 if kind == "lstm" else 1.5
    # a small curvature estimate, refreshed every 3rd hyper step: several hyper steps in 120
    cb = LearnedWeightDecay(
        1e-3, every_n_steps=1, curvature=EstimatedCurvature(batches=1, iters=5, every=3)
    )
    spent: list[float] = []

    def units() -> float:
        c = cb.sid.cost if cb.sid is not None else None
        if c is None:
            return 0.0
        return per_hvp * (c.jacobian_vector_products + c.curvature_products) + c.hypergradients

    def clock() -> float:
        return float(trainer.global_step) + units()

    cb.budget = budget_cls(0.5, clock=clock)
    original = cb._hyper_step

    def hyper_step(trainer, module):
        before = units()
        original(trainer, module)
        spent.append(units() - before)

    cb._hyper_step = hyper_step
    trainer = lightning_problems.trainer([cb], max_steps=120, limit_val_batches=0)
    trainer.fit(_SmallNet(kind), loader, val)
    budget, train = cb.budget, float(trainer.global_step)
    assert len(spent) >= 3 and budget.skipped > 0  # the budget spaced the due hyper steps
    assert max(spent) > min(spent)  # curvature estimates made some hyper steps dearer
    # the hyper steps and the one product timed before the first (the callback's added work)
    assert math.isclose(budget.spent_hyper, sum(spent) + budget.spent_added)
    assert budget.spent_training == train
    assert budget.spent_hyper <= 0.5 * train  # eq. budget at the end of the fit: no slack
    assert budget.spent_hyper >= 0.5 * train - 2 * max(spent)  # and it spends what it may


def _priced_fit(per_hvp: float, steps: int, max_overhead: float = 0.5, budget_cls=OverheadBudget):
    """The drop-in with its defaults (a hyper step every 20 steps, k = 3, a curvature estimate
    of 2 batches × 10 Lanczos products) on the CNN with BatchNorm, a clock counting a training
    step 1 and a Hessian–vector product ``per_hvp``: the callback, and each hyper step's
    (units, curvature products)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(192, 1, 8, 8, generator=g), torch.randint(0, 3, (192,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:128], y[:128]), 16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[128:], y[128:]), 32)
    cb = LearnedWeightDecay(1e-3)
    steps_run: list[tuple[float, int]] = []

    def units() -> float:
        c = cb.sid.cost if cb.sid is not None else None
        return 0.0 if c is None else per_hvp * (c.jacobian_vector_products + c.curvature_products)

    cb.budget = budget_cls(max_overhead, clock=lambda: float(trainer.global_step) + units())
    original = cb._hyper_step

    def hyper_step(trainer, module):
        before, curvature = units(), cb.sid.cost.curvature_products
        original(trainer, module)
        steps_run.append((units() - before, cb.sid.cost.curvature_products - curvature))

    cb._hyper_step = hyper_step
    trainer = lightning_problems.trainer([cb], max_steps=steps, limit_val_batches=0)
    trainer.fit(_SmallNet("cnn_bn"), loader, val)
    assert trainer.global_step == steps
    return cb, steps_run


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget, PacedBudget])
def test_a_curvature_estimate_dearer_than_the_allowance_is_shortened(budget_cls):
    """A product costs 5 training steps: the drop-in's first curvature estimate (20 products,
    100 steps) is the whole allowance of a 200-step fit at max_overhead=0.5. It is shortened to
    its share of what the fit can pay back (≥ 2 Lanczos steps), the fit's final share stays
    within the budget — no slack — and hyper steps still run after it."""
    cb, ran = _priced_fit(per_hvp=5.0, steps=200, budget_cls=budget_cls)
    budget = cb.budget
    assert budget.spent_hyper <= 0.5 * budget.spent_training  # the end of the fit: a ceiling
    assert budget.spent_training == 200
    first_units, first_curvature = ran[0]
    assert 2 <= first_curvature < 20  # shortened (the product timed first is counted apart)
    assert len(ran) >= 2  # the budget is spent on hyper steps, not only on one estimate
    assert budget.product_cost == 5.0


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget, PacedBudget])
def test_a_hyper_step_that_cannot_fit_does_not_run(budget_cls):
    """A product costs 30 training steps: even the fewest products of a first hyper step (two
    Lanczos steps, three adjoint steps, the cross term and its check) cost more than a 100-step
    fit pays at max_overhead=0.5. No hyper step runs; what was spent — the one product timed to
    learn that — stays within the budget."""
    cb, ran = _priced_fit(per_hvp=30.0, steps=100, budget_cls=budget_cls)
    budget = cb.budget
    assert ran == [] and budget.hyper_steps == 0 and budget.skipped > 0
    assert budget.spent_hyper == 30.0 <= 0.5 * budget.spent_training


def _probed_fit(per_forward: float, steps: int, monkeypatch, budget_cls=OverheadBudget):
    """:func:`_priced_fit`'s CNN with BatchNorm and the drop-in's default rule
    (``invariant="held"``: a scale-invariance probe before the first hyper step), a clock counting
    a training step 1, a product 1 and a forward pass of the probe ``per_forward``: the callback,
    the probe's forwards, the one-off costs announced to the budget and the hyper steps run
    (``budget_cls=None``: no budget)."""
    forwards = [0]
    original = invariance_module._probe_loss

    def counted(*args):
        loss = original(*args)

        def f():
            forwards[0] += 1
            return loss()

        return f

    monkeypatch.setattr(invariance_module, "_probe_loss", counted)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(192, 1, 8, 8, generator=g), torch.randint(0, 3, (192,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:128], y[:128]), 16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[128:], y[128:]), 32)
    cb = LearnedWeightDecay(1e-3, max_overhead=None if budget_cls is None else 0.5)
    announced: list[float] = []

    def units() -> float:
        c = cb.sid.cost if cb.sid is not None else None
        products = 0.0 if c is None else c.jacobian_vector_products + c.curvature_products
        return products + per_forward * forwards[0]

    if budget_cls is not None:
        cb.budget = budget_cls(0.5, clock=lambda: float(trainer.global_step) + units())
        expect = cb.budget.expect_one_off
        cb.budget.expect_one_off = lambda cost: (announced.append(cost), expect(cost))[1]
    ran: list[int] = []
    original_step = cb._hyper_step

    def hyper_step(trainer, module):
        assert cb.invariant_groups is not None  # probed before, not inside, the hyper step
        ran.append(trainer.global_step)
        original_step(trainer, module)

    cb._hyper_step = hyper_step
    trainer = lightning_problems.trainer([cb], max_steps=steps, limit_val_batches=0)
    trainer.fit(_SmallNet("cnn_bn"), loader, val)
    return cb, forwards[0], announced, ran


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget])
def test_the_budget_plans_the_invariance_probe_before_the_first_hyper_step(budget_cls, monkeypatch):
    """The probe (1 base forward + at most 4 per λ slot) is one-off work the first hyper step
    needs: the budget is told its worst case (one forward timed × the forwards planned) before
    it allows that hyper step, and the probe runs as the callback's added work, not inside the
    hyper step. Counted in forwards and products, never timed: what the budget was told is the
    plan exactly, the probe stays within it, and the fit's final share within max_overhead."""
    cb, forwards, announced, ran = _probed_fit(1.0, 200, monkeypatch, budget_cls)
    slots = len(cb.problem.decay.group_names())
    planned = 1 + MAX_FORWARDS * slots
    assert slots == 3 and announced == [float(planned), 0.0]  # told, then cleared once run
    assert cb.invariant_groups == {"body.0": True, "body.1": False, "body.4": False}
    assert 1 < forwards - 1 <= planned  # the probe's own forwards (after the timed one)
    budget = cb.budget
    assert ran and budget.hyper_steps == len(ran) and budget.one_off == 0.0
    assert budget.spent_added >= forwards  # the probe and its timing: the callback's work
    assert budget.spent_training == 200
    assert budget.spent_hyper <= 0.5 * budget.spent_training  # the end of the fit: no slack


@pytest.mark.parametrize("budget_cls", [OverheadBudget, PlannedBudget])
def test_a_fit_that_cannot_pay_for_the_probe_runs_no_probe_and_says_so(budget_cls, monkeypatch):
    """A probe forward costs 8 training steps: the probe's worst case (13 forwards, 104 steps)
    is more than a 100-step fit's whole allowance (50). Neither the probe nor a hyper step runs
    (before, the probe ran inside the first hyper step the budget allowed, unplanned: on
    MobileNetV3-small that hyper step spent twice the fit's allowance), what was spent — one
    forward and one product timed to learn it — stays within the budget, and the fit says why,
    naming the probe."""
    with pytest.warns(UserWarning, match=r"allowed none of the 5 hyper steps.*invariance probe"):
        cb, forwards, announced, ran = _probed_fit(8.0, 100, monkeypatch, budget_cls)
    assert announced == [8.0 * (1 + MAX_FORWARDS * 3)] and cb.budget.one_off == announced[0]
    assert ran == [] and cb.invariant_groups is None and forwards == 1  # the timed one only
    assert cb.budget.spent_hyper == 8.0 + 1.0 <= 0.5 * cb.budget.spent_training


def test_without_a_budget_the_probe_is_not_timed(monkeypatch):
    """``max_overhead=None``: nothing is announced or timed; the probe runs once, before the
    first hyper step, within its planned forwards."""
    cb, forwards, announced, ran = _probed_fit(1.0, 60, monkeypatch, budget_cls=None)
    assert isinstance(cb.budget, NoBudget) and announced == [] and len(ran) == 3
    assert cb.invariant_groups == {"body.0": True, "body.1": False, "body.4": False}
    assert 1 < forwards <= 1 + MAX_FORWARDS * 3


def test_a_bad_one_off_cost_is_refused():
    budget = OverheadBudget(0.5, clock=_Clock())
    for bad in (-1.0, math.nan, math.inf, "1"):
        with pytest.raises(ConfigurationError, match="expect_one_off"):
            budget.expect_one_off(bad)
    assert budget.one_off == 0.0 and NoBudget().expect_one_off(3.0) is None


def test_the_allowance_shortens_the_adjoint_solve_and_skips_what_does_not_fit():
    """A hyper step's Deadline on a fake clock: the adjoint steps that fit (at least one), a
    refresh or retry only where its products fit, Lanczos steps only within the curvature's
    share (at least two)."""
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    budget.product_cost = 2.0
    deadline = Deadline(budget, end=20.0, curvature_end=8.0, fixed=4.0)
    assert deadline.adjoint_steps(10) == 8 and deadline.adjoint_steps(3) == 3
    assert deadline.adjoint_steps(10, after=2) == 6
    assert deadline.affords(8) and not deadline.affords(9)
    assert deadline.curvature_batches(2) == 2 and deadline.curvature_batches(4) == 2
    clock.now = 19.0
    assert deadline.adjoint_steps(10) == 1 and not deadline.affords(1)
    clock.now, started = 6.0, 0.0  # two Lanczos steps of one product each took 6: 3 a product
    assert not deadline.lanczos_continues(started, 2, 1)  # 6 + 3 > 8
    assert deadline.lanczos_continues(started, 1, 1)  # fewer than two: always
    assert budget.product_cost > 2.0  # re-measured from the Lanczos steps


def test_before_the_first_hyper_step_its_fixed_part_is_two_steps_and_two_products():
    """The first hyper step's checks and validation gradient are not products: measured 12–14
    training steps on ResNet-18, where two training steps alone let it overdraw by a product."""
    clock = _Clock()
    budget = OverheadBudget(0.5, clock=clock)
    budget.training_step_done()
    clock.now += 1.0
    budget.training_step_done()
    budget.note_product_cost(3.0)
    assert budget.predicted(0) == 2 * (1.0 + 3.0) and budget.predicted(5) == 8.0 + 15.0


def test_the_default_clock_is_cpu_time_on_the_cpu_and_wall_time_elsewhere():
    """On a shared machine wall time counts other processes' load into the training's cost (and
    so into the allowance); on the CPU the budget reads the process's CPU time instead."""
    import time

    budget = OverheadBudget(0.5)
    assert budget.clock is time.perf_counter
    budget.use_device("cpu")
    assert budget.clock is time.process_time
    budget.use_device("cuda")
    assert budget.clock is time.perf_counter
    clock = _Clock()
    given = OverheadBudget(0.5, clock=clock)
    given.use_device("cpu")
    assert given.clock is clock  # a given clock is kept
    cb = LearnedWeightDecay(1e-2, every_n_steps=5, max_overhead=0.5)
    lightning_problems.trainer([cb], max_epochs=1, limit_val_batches=0).fit(
        _Net(), datamodule=RidgeData()
    )
    assert cb.budget.clock is time.process_time


def _planned_run(budget: OverheadBudget, clock: _Clock, steps: int, every: int, first: float,
                 regular: float, products: int = 4, first_products: int | None = None
                 ) -> list[int]:  # fmt: skip
    """A fit of known length: each step costs 1, a hyper step is due every ``every`` steps
    (a due one waits, as in the callback, until the budget allows it), the first costs
    ``first`` (its curvature estimate), the others ``regular``; a product costs 1; a hyper step
    reports ``products`` products made (the first ``first_products``, its curvature estimate's
    included, where given)."""
    budget.training_step_done()
    budget.note_product_cost(1.0)
    ran, waiting = [], False
    for step in range(1, steps + 1):
        clock.now += 1.0
        budget.training_step_done()
        waiting = waiting or step % every == 0
        due_left = 1 + steps // every - step // every
        if waiting and budget.allows(steps - step, products, due_left):
            waiting = False
            budget.start_hyper_step()
            clock.now += first if not ran else regular
            made = first_products if first_products is not None and not ran else products
            budget.end_hyper_step(made)
            ran.append(step)
    return ran


def test_the_planned_budget_runs_every_due_hyper_step_the_fit_can_pay_for():
    """A 400-step fit, a hyper step due every 20 steps, the first 40 units (its curvature
    estimate), the others 8, max_overhead 0.5: the fit pays for 200, and 40 + 19 × 8 = 192.
    PlannedBudget (eq. budgetplan) runs all 20 at their due steps; OverheadBudget pays the
    first back before the next (credit 0.5 · t − 40 ≥ 0 at t = 80), so none at 40 or 60."""
    clock = _Clock()
    planned = PlannedBudget(0.5, clock=clock)
    ran = _planned_run(planned, clock, 400, 20, first=40.0, regular=8.0)
    assert ran == list(range(20, 401, 20))
    assert planned.spent_training == 400 and planned.spent_hyper == 40 + 19 * 8 <= 0.5 * 400
    clock = _Clock()
    paid_back = OverheadBudget(0.5, clock=clock)
    old = _planned_run(paid_back, clock, 400, 20, first=40.0, regular=8.0)
    assert old[:2] == [20, 80] and len(old) < 20


def test_the_planned_budget_shares_what_is_left_evenly_and_keeps_the_final_share():
    """Its plan by hand: after 20 of 400 steps (a product timed at 1), credit = 10 and the
    ceiling 10 + 380 · 0.5 = 200 over the 20 hyper steps still due: share 10; the first's
    curvature estimate may spend a third of the 200 on top (its deadline 10 + 66.7 from now).
    Where the hyper steps cost more than the fit can pay (first 60, then 16 each: 364 > 200),
    as many run as it pays for, spread to the end, and the final share stays within
    max_overhead."""
    clock = _Clock()
    budget = PlannedBudget(0.5, clock=clock)
    budget.training_step_done()
    budget.note_product_cost(1.0)
    for _ in range(20):
        clock.now += 1.0
        budget.training_step_done()
    assert budget.share(380, 4, 20) == 10.0
    deadline = budget.allowance(380, 4, 20)
    assert math.isclose(deadline.end, 20 + 10 + 200 / 3)
    assert math.isclose(deadline.curvature_end, 20 + 200 / 3)
    clock = _Clock()
    budget = PlannedBudget(0.5, clock=clock)
    ran = _planned_run(budget, clock, 400, 20, first=60.0, regular=16.0)
    assert budget.spent_hyper <= 0.5 * 400  # no slack at the end
    assert len(ran) == 1 + (200 - 60) // 16  # all it can pay for
    assert ran[-1] > 300  # spread to the end, not spent at the start
    # the second runs at its due step (its fixed part not yet measured), then the debt is paid
    # and one runs every 16 / 0.5 steps
    assert ran[:2] == [20, 40] and {b - a for a, b in zip(ran[2:], ran[3:])} == {32}


def test_the_callback_counts_the_hyper_steps_still_due():
    """1 (the one waiting) + those due at the steps left: every 20 steps of 400, from step 20
    (start_step 0) or step 100 (start_step 100)."""
    cb = LearnedWeightDecay(1e-2, every_n_steps=20)
    trainer = SimpleNamespace(global_step=20, estimated_stepping_batches=400, callbacks=[])
    assert cb._due_left(trainer) == 20
    trainer.global_step = 33  # the one due at 20 still waiting
    assert cb._due_left(trainer) == 1 + 19
    cb.start_step, trainer.global_step = 100, 10
    assert cb._due_left(trainer) == 1 + 16  # 100, 120, ..., 400
    trainer.estimated_stepping_batches, trainer.global_step = float("inf"), 100
    assert cb._due_left(trainer) == 1 + 5  # length unknown: the horizon's R = 100 steps run


def test_the_planned_deadline_affords_a_retry_from_the_spare_and_moves_its_end():
    """A retry after a divergence (or a refresh) is dear work a hyper step cannot plan for: under
    PlannedBudget it is afforded while its products fit by ``spare_end`` (a third of all the fit
    can still spend, on top of the part), and granting it moves ``end`` to cover them, so the
    retried solve gets its adjoint steps."""
    from hypertorch_sid.core.budget import PlannedDeadline

    clock = _Clock()
    budget = PlannedBudget(0.5, clock=clock)
    budget.product_cost = 2.0
    deadline = PlannedDeadline(budget, end=10.0, curvature_end=3.0, fixed=2.0, spare_end=30.0)
    clock.now = 9.0  # the part is spent
    assert deadline.adjoint_steps(3) == 1
    assert deadline.affords(5)  # 9 + 2 + 5 · 2 = 21 ≤ 30
    assert deadline.end == 21.0 and deadline.adjoint_steps(3) == 3
    assert not deadline.affords(10)  # 9 + 2 + 20 > 30
    assert deadline.end == 21.0


def test_the_paced_budget_amortises_the_first_hyper_steps_excess_over_the_fit():
    """A 400-step fit, a hyper step due every 20 steps, a product 1, each hyper step 4 products
    and a fixed part of 4 (8 units); the first also makes a curvature estimate of 32 products
    (40 units): its excess E = 40 − 8 = 32 (eq. budgetpace). After it the credit is
    10 − 40 = −30, above −E · 380/400 = −30.4; each later one gains 0.5 · 20 − 8 = 2 per due
    step while the allowed debt shrinks by 32 · 20/400 = 1.6, so all 20 due run, at their due
    steps (OverheadBudget pays the 30 back first: none at 40 or 60), and the fit's final share
    stays within max_overhead: 40 + 19 · 8 = 192 ≤ 200."""
    clock = _Clock()
    paced = PacedBudget(0.5, clock=clock)
    ran = _planned_run(paced, clock, 400, 20, first=40.0, regular=8.0, first_products=36)
    assert ran == list(range(20, 401, 20))
    assert paced.first_excess(4) == 32.0
    assert paced.spent_training == 400 and paced.spent_hyper == 40 + 19 * 8 <= 0.5 * 400
    clock = _Clock()
    old = OverheadBudget(0.5, clock=clock)
    ran_old = _planned_run(old, clock, 400, 20, first=40.0, regular=8.0, first_products=36)
    assert ran_old[:2] == [20, 80]


def test_the_paced_budget_repays_the_first_excess_evenly_and_keeps_the_final_share():
    """Hyper steps dearer than the due spacing pays for: the first 60 units (56 products), the
    others 16 (4 products, fixed part 12). Once two have run, E = 60 − 16 = 44, repaid at
    44/400 per step: a gap g between hyper steps with 0.5 · g − 16 = 44 · g/400, g ≈ 41 steps
    (eq. budgetpace), from the second one at its due step 40 on — OverheadBudget holds the second
    until the first is paid back (step 120), then one every 32 steps. The same number run; the
    final share stays within max_overhead (no slack at the end)."""
    clock = _Clock()
    paced = PacedBudget(0.5, clock=clock)
    ran = _planned_run(paced, clock, 400, 20, first=60.0, regular=16.0, first_products=56)
    assert paced.first_excess(4) == 44.0
    assert ran[:2] == [20, 40]
    assert {b - a for a, b in zip(ran[2:], ran[3:])} <= {41, 42}  # the paced gap
    assert paced.spent_hyper <= 0.5 * paced.spent_training == 200
    clock = _Clock()
    old = OverheadBudget(0.5, clock=clock)
    ran_old = _planned_run(old, clock, 400, 20, first=60.0, regular=16.0, first_products=56)
    assert ran_old[1] == 120 and len(ran_old) == len(ran)
    assert old.spent_hyper == paced.spent_hyper
    # where the fit's length is unknown: OverheadBudget's rule (debt paid back first)
    clock = _Clock()
    unknown = PacedBudget(0.5, clock=clock)
    assert _simulate(unknown, clock, 100, lambda i: 20.0 if i == 0 else 4.0)[:2] == [1, 41]


def test_the_data_weights_under_a_budget_move_rows_in_their_hyper_steps_only():
    """``LearnedDataWeights(max_overhead=0.5)``: the cross term at every training batch is work
    a budget cannot space (under one it left the hyper steps 3 of 400 due, no separation), so a
    budget makes ``cross_term="hyper_step"`` the default and refuses ``"training"``. Counted in
    work (one unit per training step, two per product, one per validation gradient): the hyper
    steps stay within half of the training and the corrupted examples' weights fall."""
    from test_data_weights_networks import fit_noisy_digits

    from hypertorch_sid import LearnedDataWeights

    with pytest.raises(ConfigurationError, match="cross_term='training'.*max_overhead=None"):
        LearnedDataWeights(cross_term="training", max_overhead=0.5)
    assert LearnedDataWeights().cross_term == "training"
    assert LearnedDataWeights(max_overhead=None, cross_term="training").every_n_steps == 40
    state: dict = {}

    class KeepTrainer(pl.Callback):
        def setup(self, trainer: pl.Trainer, *args, **kwargs) -> None:
            state["trainer"] = trainer

    def clock() -> float:
        steps, sid = float(state["trainer"].global_step), state["cb"].sid
        if sid is None:
            return steps
        c = sid.cost
        return steps + 2.0 * (c.jacobian_vector_products + c.curvature_products) + c.hypergradients

    cb = LearnedDataWeights(seed=0, max_overhead=OverheadBudget(0.5, clock=clock))
    assert cb.cross_term == "hyper_step" and cb.every_n_steps == 10
    state["cb"] = cb
    _, corrupted = fit_noisy_digits("mlp", "sgd", 0, [KeepTrainer(), cb])
    w, budget = cb.data_weights(), cb.budget
    assert float(w[corrupted].mean()) < float(w[~corrupted].mean()) - 0.25
    assert budget.hyper_steps >= 5 and budget.skipped > 0
    assert budget.spent_hyper <= 0.5 * budget.spent_training + 2.0 * 40
