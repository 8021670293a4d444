"""The short-fit warning's advice is a setting that would give hyper steps in this fit."""

from hypertorch_sid.lightning.metrics import few_hyper_steps


def test_a_start_step_past_the_fit_asks_to_lower_it_not_for_negative_hyper_steps():
    # LearnedDataWeights' defaults (every_n_steps=40, start_step=50) on a fit of 19 steps
    said = few_hyper_steps(19, 40, 50, 0)
    assert said is not None and "only 0 hyper steps" in said
    assert "lower start_step" in said and "ends at step 19" in said
    assert "pass every_n_steps" not in said  # every_n_steps=1 gives none either
    assert "-" not in said.replace("every_n_steps", "").replace("start_step", "")


def test_a_start_step_inside_the_fit_still_suggests_every_n_steps():
    said = few_hyper_steps(79, 40, 50, 0)  # steps 50..79: 30 left, none a multiple of 40
    assert said is not None and "only 0 hyper steps" in said
    assert "pass every_n_steps=1 for 30 hyper steps" in said
    assert "lower start_step" not in said
