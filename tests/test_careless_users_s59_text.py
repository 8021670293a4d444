"""Careless users, session 59: numbers given as text (a YAML file reads ``1e-3`` as the
string '1e-3'; so does a command line without ``type=``) or an integer given as a whole float.

Each case failed before its fix with a message that contradicted itself ("must be a finite
number > 0, got '1e-3'") or gave no fix; the controls (text that is no number, a number the
setting would still refuse) name no number to pass. See docs/failures.md, "Session 59:
careless inputs, numbers given as text".
"""

from __future__ import annotations

from typing import Any

import pytest

from hypertorch_sid import ConfigurationError, LearnedDataWeights, LearnedWeightDecay, SIDConfig

TEXT = [
    (lambda: LearnedWeightDecay(weight_decay="1e-3"), "weight_decay=float('1e-3') = 0.001"),
    (lambda: LearnedWeightDecay(min_weight_decay="1e-8"), "min_weight_decay=float('1e-8')"),
    (lambda: LearnedWeightDecay(max_overhead="0.5"), "max_overhead=float('0.5') = 0.5"),
    (lambda: LearnedWeightDecay(every_n_steps="4"), "every_n_steps=int('4') = 4"),
    (lambda: LearnedDataWeights(per="class", num_classes="10"), "num_classes=int('10') = 10"),
]


@pytest.mark.parametrize("make, fix", TEXT, ids=[f.split("=")[0] for _, f in TEXT])
def test_a_number_given_as_text_is_named_as_the_number_to_pass(make: Any, fix: str) -> None:
    """weight_decay='1e-3' said "must be a finite number > 0, got '1e-3': the initial λ, e.g.
    the optimizer's former weight_decay (1e-4)"; every_n_steps='4' "must be an integer ≥ 1,
    got '4'" — the value looks right and no fix was named."""
    with pytest.raises(ConfigurationError, match="it is the text") as caught:
        make()
    assert fix in str(caught.value) and "YAML" in str(caught.value)


@pytest.mark.parametrize(
    "make, fix",
    [
        (lambda: LearnedWeightDecay(every_n_steps=4.0), ": pass every_n_steps=4."),
        (lambda: SIDConfig(adjoint_steps=5.0), ": pass adjoint_steps=5."),
        (lambda: LearnedDataWeights(per="class", num_classes=10.0), ": pass num_classes=10."),
    ],
)
def test_a_whole_float_count_is_named_as_the_integer_to_pass(make: Any, fix: str) -> None:
    """every_n_steps=4.0 said "must be an integer ≥ 1, got 4.0" without the integer."""
    with pytest.raises(ConfigurationError) as caught:
        make()
    assert str(caught.value).endswith(fix)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LearnedWeightDecay(weight_decay="abc"),
        lambda: LearnedWeightDecay(weight_decay="-1"),
        lambda: LearnedWeightDecay(every_n_steps="four"),
        lambda: LearnedWeightDecay(every_n_steps="0"),
        lambda: LearnedWeightDecay(every_n_steps=2.5),
        lambda: LearnedDataWeights(per="class", num_classes=1.0),
        lambda: LearnedWeightDecay(max_overhead="-0.5"),
    ],
    ids=["abc", "negative_text", "four", "zero_text", "fraction", "one_class", "neg_budget"],
)
def test_text_or_a_float_the_setting_still_refuses_names_no_number(make: Any) -> None:
    """Controls: no "pass …=" suggestion of a value that would be refused as well."""
    with pytest.raises(ConfigurationError) as caught:
        make()
    message = str(caught.value)
    assert "it is the text" not in message and ": pass every_n_steps=" not in message
    assert ": pass num_classes=" not in message


def test_a_fit_without_validation_data_is_said_by_the_callback_the_user_added() -> None:
    """LearnedWeightDecay fitted without validation data said "HyperOptimizationCallback needs
    validation data …", a class the user never named (the lead's speaker fix of this session
    left four such messages)."""
    import warnings

    from lightning_problems import TOY_X, TOY_Y, ToyClassifier, trainer
    from torch.utils.data import DataLoader, TensorDataset

    train = DataLoader(TensorDataset(TOY_X, TOY_Y), batch_size=16)
    fitter = trainer([LearnedWeightDecay(every_n_steps=4, start_step=0)], max_epochs=1)
    with pytest.raises(ConfigurationError, match=r"^LearnedWeightDecay needs validation data"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitter.fit(ToyClassifier(), train)
