"""``BilevelModule`` for the unified ``lightning`` package (``import lightning as L``).

Lightning installs under two names, ``pytorch_lightning`` and ``lightning.pytorch``, each with its
own ``LightningModule``; a ``lightning.Trainer`` refuses a ``pytorch_lightning`` module ("`model`
must be a `LightningModule`"). The callbacks (``LearnedWeightDecay``, ``LearnedDataWeights``,
``HyperOptimizationCallback``) work under either Trainer as they are; only the module's base
class must match the Trainer's::

    import lightning as L
    from hypertorch_sid import HyperOptimizationCallback
    from hypertorch_sid.lightning.unified import BilevelModule

    class Ridge(BilevelModule): ...  # as with hypertorch_sid.BilevelModule

    L.Trainer(callbacks=[HyperOptimizationCallback()]).fit(Ridge(8), train, val)

Importing this module needs ``lightning`` installed (``pip install lightning``).
"""

from __future__ import annotations

try:
    import lightning.pytorch as L
except ImportError as missing:  # pragma: no cover - exercised where lightning is absent
    raise ImportError(
        "hypertorch_sid.lightning.unified is the BilevelModule for the unified `lightning` "
        "package, which is not installed: `pip install lightning`, or use "
        "hypertorch_sid.BilevelModule with pytorch_lightning.Trainer."
    ) from missing

from .module import Bilevel

__all__ = ["BilevelModule"]


class BilevelModule(Bilevel, L.LightningModule):
    """A ``lightning.pytorch.LightningModule`` with hyperparameters λ kept apart from its
    parameters w, for ``lightning.Trainer``: everything else as
    :class:`hypertorch_sid.lightning.BilevelModule` (``register_hyperparameter``, ``inner_loss``,
    ``outer_loss``, ``inner_parameters``)."""
