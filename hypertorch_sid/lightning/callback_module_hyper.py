"""λ living in the module being trained (a ``BilevelModule``'s hyperparameters) during a fit.

:class:`ModuleHyperparameters` is a mixin of
:class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`: the training optimizers
must not move λ, so it is frozen (``requires_grad`` off) from ``setup`` to the fit's end and
given its flags back then; the values the hyper steps leave are noted after each outer step and
restored at the fit's end where a weight-averaging callback copied its average over them
(:mod:`~hypertorch_sid.lightning.averaging`).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info

from .averaging import put_learned_in_averages
from .module import Bilevel

__all__ = ["ModuleHyperparameters"]


class ModuleHyperparameters:
    """Freezing, noting and restoring λ in the module (a mixin of
    :class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`)."""

    def _freeze_module_hyperparameters(self, pl_module: pl.LightningModule) -> None:
        if isinstance(pl_module, Bilevel):
            named = list(pl_module.named_hyperparameters())
            self._frozen = [(h, h.requires_grad) for _, h in named]
            self._names = [name for name, _ in named]
            for h, _ in self._frozen:
                h.requires_grad_(False)
                h.grad = None

    def _unfreeze(self) -> None:
        for h, flag in self._frozen:
            h.requires_grad_(flag)
        self._frozen, self._learned, self._names = [], [], []

    def _remember_learned(self, trainer: pl.Trainer) -> None:
        """Note λ as the hyper steps left it; weight-averaging callbacks' copies of the module
        carry it too (:mod:`~hypertorch_sid.lightning.averaging`: else they average λ, then swap
        that average in for validation and write it into checkpoints)."""
        self._learned = [h.detach().clone() for h, _ in self._frozen]
        put_learned_in_averages(trainer, self._names, self._learned)

    def _keep_learned(self, trainer: pl.Trainer) -> None:
        """λ living in the module (a ``BilevelModule``'s) ends the fit at the values the hyper
        steps gave it. A callback that averages the module's parameters — Lightning's
        ``EMAWeightAveraging``/``WeightAveraging``, ``StochasticWeightAveraging`` — copies its
        average into all of them at the end of the training, λ included (measured: a log λ
        learned to -0.35 came back as -0.007, its EMA with decay 0.999); the weights keep that
        callback's average, λ is put back (teardown runs after every callback's
        ``on_train_end``)."""
        changed = [
            h for (h, _), learned in zip(self._frozen, self._learned)
            if not torch.equal(h.detach(), learned.to(h.device))
        ]  # fmt: skip
        put_learned_in_averages(trainer, self._names, self._learned)  # for a save after the fit
        if not changed:
            return
        with torch.no_grad():
            for (h, _), learned in zip(self._frozen, self._learned):
                h.copy_(learned)
        rank_zero_info(
            f"{type(self).__name__}: {len(changed)} hyperparameter tensor(s) of the module were "
            "changed after the last hyper step (a callback averaging the module's parameters, "
            "such as EMAWeightAveraging or StochasticWeightAveraging, copies its average into "
            "them at the end of the fit): they are given back the values the hyper steps "
            "learned; the weights keep that callback's average."
        )
