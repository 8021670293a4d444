"""The screen's variants of the bound in TrustRprop (eq. decaytrust), for run.sh.

TrustRpropR is the library's TrustRprop (δ/(ηR), R the steps left) as it was screened, before
it moved into hypertorch_sid.core.outer_step; TrustRpropN bounds a rise by δ/(ηN), N the
training steps since the last hyper step (tried first, not kept).
"""

import math

from hypertorch_sid.core.outer_step import TrustRprop


class TrustRpropR(TrustRprop):
    def observe(self, remaining_steps, eta):
        self.max_rise = math.inf
        if remaining_steps and eta and remaining_steps > 0 and eta > 0:
            self.max_rise = self.defaults["trust"] / (eta * remaining_steps)


class TrustRpropN(TrustRprop):
    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self._remaining = None

    def observe(self, remaining_steps, eta):
        before, self._remaining = self._remaining, remaining_steps
        self.max_rise = math.inf
        if before is not None and remaining_steps is not None and eta and eta > 0:
            n = before - remaining_steps
            if n > 0:
                self.max_rise = self.defaults["trust"] / (eta * n)
