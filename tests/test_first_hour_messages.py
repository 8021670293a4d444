"""What a new user reads in the first hour: the short-fit advice, the progress bar's λ."""

import pytest

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


def test_the_default_rich_progress_bar_shows_a_small_lambda_not_0_000():
    """Lightning's RichProgressBar prints .3f: the drop-in's ``lam`` of 1e-4 read 0.000."""
    pytest.importorskip("rich")
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import RichProgressBar
    from pytorch_lightning.callbacks.progress.rich_progress import RichProgressBarTheme

    from hypertorch_sid import LearnedWeightDecay

    module = pl.LightningModule()
    module.layer = torch.nn.Linear(2, 1)
    default, chosen = RichProgressBar(), RichProgressBar(theme=RichProgressBarTheme("red"))
    for bar, expected in ((default, ".3g"), (chosen, ".3f")):
        trainer = pl.Trainer(callbacks=[bar, LearnedWeightDecay()], logger=False)
        for callback in trainer.callbacks:
            if isinstance(callback, LearnedWeightDecay):
                callback.setup(trainer, module, "fit")
        assert bar.theme.metrics_format == expected
    assert f"{1e-4:{default.theme.metrics_format}}" == "0.0001"
    assert RichProgressBar().theme.metrics_format == ".3f"  # its shared default theme is intact


def test_the_short_fit_warning_does_not_promise_that_lambda_stays_put():
    """A digits CNN's fit warned of 9 hyper steps: the 6 its budget ran moved λ 20× (5e-4 →
    2.5e-5, TrustRprop). "barely move" alone was wrong; the warning says either may happen."""
    said = few_hyper_steps(190, 20, 0, 0)
    assert said is not None and "only 9 hyper steps" in said
    assert "barely move" in said and "too few hyper steps left to correct themselves" in said
