"""LateBudget (eq. budgetlate): the budget's credit saved in the first part of a fit, spent in
the rest — its plan counted in work units against a hand count, never timed (as
tests/test_budget.py does for the other budgets)."""

from __future__ import annotations

import pytest

from hypertorch_sid import ConfigurationError, LearnedWeightDecay
from hypertorch_sid.core.budget import LateBudget, OverheadBudget


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(budget: OverheadBudget, clock: _Clock, steps: int = 400, every: int = 10,
         first: float = 40.0, regular: float = 10.0, known: bool = True) -> list[int]:  # fmt: skip
    """A fit of ``steps`` steps costing 1 each, a hyper step due every ``every`` (a due one waits
    until the budget allows it), the first costing ``first``, the others ``regular``; 4 products
    a hyper step at 1 each. The steps at which hyper steps ran."""
    budget.training_step_done()
    budget.note_product_cost(1.0)
    ran, waiting = [], False
    for step in range(1, steps + 1):
        clock.now += 1.0
        budget.training_step_done()
        waiting = waiting or step % every == 0
        remaining = steps - step if known else None
        due_left = 1 + steps // every - step // every
        if waiting and budget.allows(remaining, 4, due_left):
            waiting = False
            budget.start_hyper_step()
            clock.now += first if not ran else regular
            budget.end_hyper_step(4)
            ran.append(step)
    return ran


def test_the_late_budget_saves_the_first_half_and_spends_it_in_the_second():
    """By hand, 400 steps, due every 10, the first hyper step 40 units, the others 10 (4 products
    + a fixed 6), max_overhead 0.5, early_share 0.25, late_from 0.5. The first runs at step 10
    (nothing spent yet). Eq. budgetlate then needs 40 ≤ 0.125 · t, t ≥ 320: none before step
    200, where the second half starts with credit 0.5 · 200 − 40 = 60. Each due hyper step
    costs 10 and 10 steps pay back 5, so the credit before the one at 200 + 10k is 60 − 5k ≥ 0
    for k = 0…12 (steps 200–320), then one every 20 steps (340, 360, 380); at 400 no step is
    left to pay for one (ceiling 0 < predicted 10). OverheadBudget instead pays the first back
    (0.5 · t ≥ 40 at t = 80) and then runs one every 20 steps, to 380."""
    clock = _Clock()
    late = LateBudget(0.5, clock=clock)
    ran = _run(late, clock)
    assert ran == [10, *range(200, 321, 10), 340, 360, 380]
    assert late.spent_hyper == 40 + 16 * 10 <= 0.5 * late.spent_training
    clock = _Clock()
    default = _run(OverheadBudget(0.5, clock=clock), clock)
    assert default == [10, *range(80, 381, 20)]
    # as many hyper steps, a share of them in the second half: 16 of 17 against 10 of 17
    assert len(ran) == len(default) == 17
    assert sum(s >= 200 for s in ran) == 16 and sum(s >= 200 for s in default) == 10


@pytest.mark.parametrize("kw", [{"early_share": 1.0}, {"late_from": 0.0}])
def test_the_late_budget_without_saving_is_the_overhead_budget(kw):
    clock = _Clock()
    same = _run(LateBudget(0.5, clock=clock, **kw), clock)
    clock = _Clock()
    assert same == _run(OverheadBudget(0.5, clock=clock), clock)


def test_the_late_budget_of_a_fit_of_unknown_length_is_the_overhead_budget():
    clock = _Clock()
    unknown = _run(LateBudget(0.5, clock=clock), clock, known=False)
    clock = _Clock()
    assert unknown == _run(OverheadBudget(0.5, clock=clock), clock, known=False)


def test_the_late_budget_saves_nothing_before_its_first_hyper_step():
    """One-off work before the first hyper step (timing a product, 5 units after 20 steps) is
    charged to the hyper steps: 5 > 0.125 · 20, yet eq. budgetlate does not hold the first back
    for it; OverheadBudget's rule (credit 10 − 5 ≥ 0) decides, as for OverheadBudget."""
    for cls in (LateBudget, OverheadBudget):
        clock = _Clock()
        budget = cls(0.5, clock=clock)
        budget.training_step_done()
        with budget.added_work():
            clock.now += 5.0
        for _ in range(20):
            clock.now += 1.0
            budget.training_step_done()
        budget.note_product_cost(1.0)
        assert budget.spent_hyper == 5.0 > 0.125 * budget.spent_training
        assert budget.allows(380, 4, 39)


@pytest.mark.parametrize(
    ("kw", "name"),
    [({"early_share": 1.5}, "early_share"), ({"early_share": "a"}, "early_share"),
     ({"late_from": 1.0}, "late_from"), ({"late_from": -0.1}, "late_from")],
)  # fmt: skip
def test_the_late_budget_names_a_bad_setting(kw, name):
    with pytest.raises(ConfigurationError, match=name):
        LateBudget(0.5, **kw)


def test_the_callback_takes_a_late_budget():
    budget = LateBudget(0.5)
    assert LearnedWeightDecay(1e-4, max_overhead=budget).budget is budget
