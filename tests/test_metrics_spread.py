"""The λ summary's logged spread (mean, min, max, quantile bands): the same numbers as one
``kthvalue`` per band, from one sort (or none for a constant tensor); above BAND_SAMPLE values,
the bands of a fixed sample."""

import torch

from hypertorch_sid.lightning.metrics import BAND_SAMPLE, QUANTILES, _sample, spread


def _by_kthvalue(v: torch.Tensor) -> dict[str, float]:
    n = v.numel()
    return {
        f"q{q}": float(v.kthvalue(min(n, max(1, round(q / 100 * n)))).values) for q in QUANTILES
    }


def test_quantile_bands_equal_kthvalue():
    torch.manual_seed(0)
    for n in (3, 4, 10, 1001, BAND_SAMPLE):
        v = torch.randn(n, dtype=torch.float64).exp()
        got = spread("x", v)
        for key, value in _by_kthvalue(v).items():
            assert got[f"x_{key}"] == value
        assert got["x_min"] == float(v.min()) and got["x_max"] == float(v.max())
        assert got["x_mean"] == float(v.mean())


def test_many_values_have_the_bands_of_a_fixed_sample_near_the_exact_ranks():
    """Above BAND_SAMPLE values the bands are kthvalue's of the same sampled positions at every
    call (they move only when the values do), within 5 standard errors of the exact rank; mean,
    min and max stay exact."""
    torch.manual_seed(1)
    n = 270_000  # per element λ of the MNIST MLP
    v = torch.randn(n, dtype=torch.float64).exp()
    got = spread("x", v)
    idx = torch.from_numpy(_sample(n))
    assert idx.numel() == BAND_SAMPLE == idx.unique().numel() and int(idx.max()) < n
    for key, value in _by_kthvalue(v[idx]).items():
        assert got[f"x_{key}"] == value
    ordered = v.sort().values
    for q in QUANTILES:
        rank = float((ordered < got[f"x_q{q}"]).double().mean())
        se = (q / 100 * (1 - q / 100) / BAND_SAMPLE) ** 0.5
        assert abs(rank - q / 100) < 5 * se
    assert got["x_min"] == float(v.min()) and got["x_max"] == float(v.max())
    assert got["x_mean"] == float(v.mean())
    assert spread("x", v) == got


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
