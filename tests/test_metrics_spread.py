"""The λ summary's logged spread (mean, min, max, quantile bands): the same numbers as one
``kthvalue`` per band, from one sort (or none for a constant tensor)."""

import torch

from hypertorch_sid.lightning.metrics import QUANTILES, spread


def _by_kthvalue(v: torch.Tensor) -> dict[str, float]:
    n = v.numel()
    return {
        f"q{q}": float(v.kthvalue(min(n, max(1, round(q / 100 * n)))).values) for q in QUANTILES
    }


def test_quantile_bands_equal_kthvalue():
    torch.manual_seed(0)
    for n in (3, 4, 10, 1001, 20000):
        v = torch.randn(n, dtype=torch.float64).exp()
        got = spread("x", v)
        for key, value in _by_kthvalue(v).items():
            assert got[f"x_{key}"] == value
        assert got["x_min"] == float(v.min()) and got["x_max"] == float(v.max())
        assert got["x_mean"] == float(v.mean())


def test_constant_values_give_that_value_in_every_band():
    v = torch.full((50,), 0.125, dtype=torch.float64)
    got = spread("lam", v)
    assert all(got[f"lam_q{q}"] == 0.125 for q in QUANTILES)
    assert got == {**{f"lam_q{q}": 0.125 for q in QUANTILES}, **_mmm(0.125)}


def test_few_values_have_no_bands():
    got = spread("lam", torch.tensor([0.1, 0.3], dtype=torch.float64))
    assert set(got) == {"lam_mean", "lam_min", "lam_max"}


def _mmm(x: float) -> dict[str, float]:
    return {"lam_mean": x, "lam_min": x, "lam_max": x}
