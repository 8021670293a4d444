"""Errors raised by the SID core: every one names what went wrong and how to fix it."""

from __future__ import annotations


class SIDError(RuntimeError):
    """Base class of the errors raised by hypertorch_sid."""


class DivergenceError(SIDError):
    """A fixed-point iteration (inner or adjoint solve) diverged or produced non-finite values.

    Attributes
    ----------
    quantity:
        Which quantity diverged: ``"inner"`` (w_t), ``"adjoint"`` (v_k), ``"outer gradient"``
        (∇E), ``"hypergradient"`` or ``"hyperparameters"``.
    step:
        The iteration at which it was detected (``None`` when not inside a loop).
    residual:
        The last residual norm ‖T̂(x) − x‖ seen (``nan``/``inf`` for non-finite values).
    hint:
        The cause, and what to change (see :meth:`with_remedy`).
    data:
        True where the cause is non-finite data (NaN/Inf in a batch or a loss from the first
        iteration), not the solver: retrying with other step sizes or damping cannot help, so
        the divergence policies do not retry, and the solver state is left as it was.
    """

    def __init__(
        self,
        quantity: str,
        step: int | None,
        residual: float,
        hint: str = "",
        data: bool = False,
    ) -> None:
        self.quantity = quantity
        self.step = step
        self.residual = residual
        self.hint = hint
        self.data = data
        where = f" at step {step}" if step is not None else ""
        msg = f"the {quantity} diverged{where} (residual norm {residual:.3g})."
        if hint:
            msg += " " + hint
        super().__init__(msg)

    def with_remedy(self, remedy: str) -> DivergenceError:
        """The same error with ``remedy`` appended: the fix for the configuration that ran.

        Where a divergence is detected (a solve, the guard) the configuration is unknown; the
        optimizer, which knows it, adds the fix (e.g. not "use damping" when damping is on).
        """
        hint = f"{self.hint} {remedy}".strip()
        return DivergenceError(self.quantity, self.step, self.residual, hint, self.data)


class ConfigurationError(SIDError, ValueError):
    """Bad arguments or inputs: the message says which and how to fix them."""


class ConvergenceWarning(UserWarning):
    """A result that is finite but visibly not what was asked: a solve that has not converged
    (its residual barely fell), or λ that the outer optimizer cannot move. The message names the
    setting to change; filter it with ``warnings.filterwarnings("ignore", category=...)``."""
