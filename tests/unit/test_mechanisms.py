"""Unit tests of the Laplace, Gaussian and exponential mechanisms and the samplers.

Expected values are derived independently in each test: closed forms, brute-force
sums of the discrete distributions with numpy, or scipy root finding on the
Balle-Wang condition.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import optimize, stats

from dpaccount.charges import cost_of
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnreleasableResultError
from dpaccount.mechanisms import (
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    RandomSource,
)
from dpaccount.mechanisms._sampling import (
    floor_sqrt_fraction,
    power_of_two_at_most,
    resolve_rng,
    sample_bernoulli,
    sample_bernoulli_exp,
    sample_discrete_laplace,
)
from dpaccount.mechanisms.gaussian import discrete_gaussian_delta_up, zcdp_delta_up

SEEDED = RandomSource.seeded


# --- randomness source ---------------------------------------------------------------------


def test_default_source_is_the_os_csprng() -> None:
    assert RandomSource().is_cryptographic
    assert resolve_rng(None).is_cryptographic
    assert not SEEDED(1).is_cryptographic
    assert LaplaceMechanism(1, 1)._rng.is_cryptographic


def test_seeded_source_is_reproducible() -> None:
    a = [sample_discrete_laplace(Fraction(5), SEEDED(3)) for _ in range(3)]
    b = [sample_discrete_laplace(Fraction(5), SEEDED(3)) for _ in range(3)]
    assert a == b
    m1 = GaussianMechanism(1, "1e-5", 1, rng=SEEDED(9))
    m2 = GaussianMechanism(1, "1e-5", 1, rng=SEEDED(9))
    assert [m1.release(0.0) for _ in range(5)] == [m2.release(0.0) for _ in range(5)]


def test_resolve_rng_accepts_random_and_refuses_junk() -> None:
    assert not resolve_rng(random.Random(1)).is_cryptographic
    with pytest.raises(InvalidCostError):
        resolve_rng(42)
    with pytest.raises(InvalidCostError):
        LaplaceMechanism(1, 1, rng="seed")


def test_sampler_argument_checks() -> None:
    rng = SEEDED(0)
    with pytest.raises(InvalidCostError):
        sample_bernoulli(Fraction(3, 2), rng)
    with pytest.raises(InvalidCostError):
        sample_bernoulli_exp(Fraction(-1), rng)
    with pytest.raises(InvalidCostError):
        sample_discrete_laplace(Fraction(0), rng)
    assert sample_bernoulli_exp(Fraction(10**9), rng) in (True, False)  # O(1) even if huge


def test_floor_sqrt_and_powers_of_two() -> None:
    assert floor_sqrt_fraction(Fraction(16)) == 4
    assert floor_sqrt_fraction(Fraction(15)) == 3
    assert floor_sqrt_fraction(Fraction(1, 4)) == 0
    assert power_of_two_at_most(Fraction(1)) == 1
    assert power_of_two_at_most(Fraction(1023, 1024)) == Fraction(1, 2)
    assert power_of_two_at_most(Fraction(1000)) == 512


# --- Laplace ---------------------------------------------------------------------------------


def test_laplace_charge_and_lattice() -> None:
    m = LaplaceMechanism("0.5", 3, dimension=2)
    assert isinstance(m, Mechanism)
    assert cost_of(m.charge) == PrivacyCost("0.5")
    # default g: largest power of two <= 3 / 2048 = 0.00146..., i.e. 2**-10
    assert m.granularity == Fraction(1, 1024)
    assert m.lattice_sensitivity == 3 * 1024 + 2  # floor(3 / g) + d
    assert m.lattice_scale == Fraction(3074) * 2
    assert m.scale == pytest.approx(3074 / 1024 * 2, rel=1e-15)
    assert m.scale >= 3 / 0.5  # never less noise than the continuous mechanism


def test_laplace_release_shapes_and_lattice_values() -> None:
    m = LaplaceMechanism(1, 1, dimension=3, granularity=Fraction(1, 4), rng=SEEDED(1))
    out = m.release(np.array([1.0, 2.0, 3.0]))
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    assert np.all(out * 4 == np.round(out * 4))  # multiples of g
    scalar = LaplaceMechanism(1, 1, granularity=Fraction(1, 3), rng=SEEDED(2)).release(5)
    assert isinstance(scalar, float)
    k = Fraction(scalar) * 3
    assert abs(k - round(k)) < Fraction(1, 10**9)  # a multiple of 1/3 (to float precision)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "x", True, [1.0, 2.0]])
def test_laplace_release_refuses_bad_values(bad: object) -> None:
    m = LaplaceMechanism(1, 1)
    with pytest.raises(UnreleasableResultError):
        m.release(bad)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"epsilon": 0, "sensitivity": 1}, "epsilon"),
        ({"epsilon": float("nan"), "sensitivity": 1}, "epsilon"),
        ({"epsilon": 1, "sensitivity": -1}, "sensitivity"),
        ({"epsilon": True, "sensitivity": 1}, "epsilon"),
        ({"epsilon": 1, "sensitivity": 1, "granularity": 0}, "granularity"),
        ({"epsilon": 1, "sensitivity": 1, "dimension": 0}, "dimension"),
        ({"epsilon": 1, "sensitivity": 1, "dimension": 1.0}, "dimension"),
    ],
)
def test_laplace_invalid_parameters(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCostError) as info:
        LaplaceMechanism(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_laplace_error_bound_matches_discrete_tail() -> None:
    m = LaplaceMechanism(1, 1, granularity=1)  # b = 2 lattice steps
    w = m.error_bound(0.9)
    q = math.exp(-1 / 2)
    # P[|Y| > w] = 2 q^(w+1) / (1 + q) <= 0.1, and w is the smallest such integer.
    assert 2 * q ** (w + 1) / (1 + q) <= 0.1 < 2 * q**w / (1 + q)
    lo, hi = m.confidence_interval(10.0, 0.9)
    assert lo < 10.0 < hi
    with pytest.raises(InvalidCostError):
        m.error_bound(1)


# --- Gaussian --------------------------------------------------------------------------------


def _balle_wang_delta(eps: float, mu: float) -> float:
    return float(
        stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
    )


def _brute_discrete_delta(eps: float, sigma2: float, shift: int) -> float:
    """max over integer shifts of sum_y max(0, P(y) - e^eps Q(y)) on a wide grid."""
    width = int(40 * math.sqrt(sigma2)) + 2 * shift + 10
    y = np.arange(-width, width + 1, dtype=np.float64)
    p = np.exp(-(y * y) / (2 * sigma2))
    p /= p.sum()
    best = 0.0
    for s in range(1, shift + 1):
        q = np.exp(-((y - s) ** 2) / (2 * sigma2))
        q /= q.sum()
        best = max(best, float(np.maximum(p - math.exp(eps) * q, 0).sum()))
    return best


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-5), (0.1, 1e-6), (4.0, 1e-8)])
def test_gaussian_analytic_sigma_matches_balle_wang(eps: float, delta: float) -> None:
    m = GaussianMechanism(eps, delta, 1)
    lattice_sens = float(m.granularity) * (math.floor(1 / m.granularity) + 1)
    # Independent solution of the Balle-Wang condition at the lattice sensitivity.
    sigma_bw = optimize.brentq(
        lambda s: _balle_wang_delta(eps, lattice_sens / s) - delta, 1e-3, 1e6, xtol=1e-12
    )
    assert m.sigma >= sigma_bw * (1 - 1e-9)
    assert m.sigma <= sigma_bw * 1.001  # the discrete check adds almost nothing
    assert m.charge.epsilon == Fraction(eps)
    assert m.charge.delta <= Fraction(delta)


def test_gaussian_charge_bounds_brute_force_discrete_delta() -> None:
    m = GaussianMechanism(1, "1e-3", 1, granularity=Fraction(1, 8))  # S = 9 lattice steps
    s2 = float(m.lattice_sigma2)
    brute = _brute_discrete_delta(1.0, s2, 9)
    assert float(m.charge.delta) >= brute
    assert float(m.charge.delta) <= brute * (1 + 1e-6) + 1e-15
    assert brute <= 1e-3


@pytest.mark.parametrize(("sigma2", "shift"), [(1.0, 1), (2.25, 3), (30.0, 4), (400.0, 20)])
def test_discrete_delta_is_an_upper_bound(sigma2: float, shift: int) -> None:
    for eps in (0.0, 0.5, 1.0, 3.0):
        brute = _brute_discrete_delta(eps, sigma2, shift)
        bound = float(discrete_gaussian_delta_up(Fraction(eps), sigma2, shift))
        assert brute <= bound <= brute * (1 + 1e-6) + 1e-12


def test_discrete_gaussian_is_not_dominated_by_continuous() -> None:
    """Why the charge is not a GaussianCharge: at sigma = 1 the discrete delta is larger."""
    assert _brute_discrete_delta(1.0, 1.0, 1) > _balle_wang_delta(1.0, 1.0) + 0.01


def test_gaussian_vector_uses_zcdp_bound() -> None:
    m = GaussianMechanism(1, "1e-5", 2, dimension=4)
    # S2² = floor((2 / g + 2)²) with g = 2**-12 (largest power of two <= 2 / (2048 * 4))
    assert m.granularity == Fraction(1, 4096)
    rho = (8192 + 2) ** 2 / (2 * float(m.lattice_sigma2))
    # independent conversion: minimise over a fine alpha grid
    alphas = np.linspace(1.001, 200, 200_000)
    logd = (alphas - 1) * (alphas * rho - 1) + (alphas - 1) * np.log1p(-1 / alphas) - np.log(alphas)
    grid_min = math.exp(float(logd.min()))  # >= the infimum over alpha
    # any alpha gives a valid bound; the code's alpha is near-optimal, never below inf
    assert grid_min * (1 - 1e-6) <= float(m.charge.delta) <= grid_min * (1 + 1e-6)
    assert m.charge.delta <= Fraction(1, 10**5)
    out = m.release([1.0, 2.0, 3.0, 4.0])
    assert out.shape == (4,)


def test_zcdp_bound_is_above_the_exact_gaussian_delta() -> None:
    for mu in (0.2, 0.5, 1.0):
        assert float(zcdp_delta_up(Fraction(1), mu * mu / 2)) >= _balle_wang_delta(1.0, mu)


def test_classic_calibration_formula_and_refusal() -> None:
    m = GaussianMechanism("0.5", "1e-5", 1, calibration="classic")
    sens = float(m.granularity) * (math.floor(1 / m.granularity) + 1)
    expected = math.sqrt(2 * math.log(1.25 / 1e-5)) * sens / 0.5
    # The lattice sigma is rounded up to 26 significant bits (so s² is exact): <= 2^-25.
    assert expected <= m.sigma <= expected * (1 + 2**-25 + 1e-9)
    for eps in (1, 2.5):
        with pytest.raises(InvalidCostError) as info:
            GaussianMechanism(eps, "1e-5", 1, calibration="classic")
        assert info.value.field == "epsilon"


@pytest.mark.parametrize("calibration", ["chernoff", "mills"])
def test_tail_bound_calibrations(calibration: str) -> None:
    eps, delta = 2.0, 1e-6
    m = GaussianMechanism(eps, delta, 1, calibration=calibration)
    sens = float(m.granularity) * (math.floor(1 / m.granularity) + 1)
    if calibration == "chernoff":
        t = math.sqrt(2 * math.log(1 / delta))
    else:
        t = max(1.0, math.sqrt(math.log(1 / (2 * math.pi * delta**2))))
    u = (t + math.sqrt(t * t + 2 * eps)) / (2 * eps)  # root of eps u - 1/(2u) = t
    # The lattice sigma is rounded up to 26 significant bits (so s² is exact): <= 2^-25.
    assert u * sens <= m.sigma <= u * sens * (1 + 2**-25 + 1e-9)
    # the tail bound must be at least as conservative as the exact condition
    assert _balle_wang_delta(eps, sens / m.sigma) <= delta


def test_too_fine_lattice_and_huge_values_are_refused() -> None:
    with pytest.raises(InvalidCostError) as info:
        GaussianMechanism(1, "1e-5", 1, granularity=Fraction(1, 2**30))
    assert info.value.field == "granularity"
    with pytest.raises(UnreleasableResultError):
        LaplaceMechanism(1, 1, granularity=Fraction(1, 2**40)).release(1e300)


def test_unknown_calibration_and_zero_delta() -> None:
    with pytest.raises(ConfigError):
        GaussianMechanism(1, "1e-5", 1, calibration="magic")
    with pytest.raises(InvalidCostError) as info:
        GaussianMechanism(1, 0, 1)
    assert info.value.field == "delta"
    with pytest.raises(InvalidCostError):
        GaussianMechanism(1, 1, 1)


def test_from_sigma_curve() -> None:
    m = GaussianMechanism.from_sigma(4, 1, granularity=Fraction(1, 16))
    with pytest.raises(ConfigError):
        _ = m.charge
    d1 = m.delta_for(1)
    assert float(d1) >= _brute_discrete_delta(1.0, float(m.lattice_sigma2), 17)
    assert m.delta_for(2) < d1  # the curve decreases
    eps = m.epsilon_for(d1)
    assert eps <= Fraction(1) * (1 + Fraction(1, 10**6))
    assert m.delta_for(eps) <= d1
    assert m.delta_for(eps * (1 - Fraction(1, 1000))) > d1  # and it is nearly tight
    charged = GaussianMechanism.from_sigma(4, 1, delta="1e-5")
    assert charged.charge.delta == Fraction(1, 10**5)
    assert charged.delta_for(charged.charge.epsilon) <= Fraction(1, 10**5)
    with pytest.raises(ConfigError):
        GaussianMechanism.from_sigma(4, 1, epsilon=1, delta="1e-5")
    with pytest.raises(InvalidCostError):
        GaussianMechanism.from_sigma(-1, 1)


# --- exponential -----------------------------------------------------------------------------


def test_exponential_probabilities_and_coefficients() -> None:
    m = ExponentialMechanism(2, 4)
    assert m.coefficient == Fraction(1, 4)
    assert ExponentialMechanism(2, 4, monotonic=True).coefficient == Fraction(1, 2)
    u = [0.0, 4.0, 8.0]
    w = [math.exp(x / 4) for x in u]
    assert m.probabilities(u) == pytest.approx([x / sum(w) for x in w], rel=1e-12)
    # log space: huge utilities do not overflow
    p = m.probabilities([1e6, 1e6 + 4.0])
    assert p == pytest.approx([1 / (1 + math.e), math.e / (1 + math.e)], rel=1e-9)
    assert m.charge.cost == PrivacyCost(2)


@pytest.mark.parametrize("bad", [[], [float("nan")], [1.0, float("inf")], "abc", [[1.0]], [True]])
def test_exponential_refuses_bad_utilities(bad: object) -> None:
    with pytest.raises(UnreleasableResultError):
        ExponentialMechanism(1, 1).release(bad)


def test_exponential_select_and_parameters() -> None:
    m = ExponentialMechanism(1, 1, rng=SEEDED(4))
    assert m.select(["x"], lambda c: 0) == "x"
    with pytest.raises(InvalidCostError):
        ExponentialMechanism(1, 1, monotonic="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidCostError):
        ExponentialMechanism(0, 1)


def test_integer_noise_takes_integers_only() -> None:
    # An integral float is its integer; anything else is refused, naming its type only
    # (int() used to truncate 3.7 to 3 and to quote a refused string in its error).
    import pandas as pd

    from dpaccount.aggregates import IntegerLaplaceMechanism

    huge = Fraction(10**6)  # epsilon: noise far below 1, so the answer is the value
    m = IntegerLaplaceMechanism(huge, 1, rng=SEEDED(3))
    assert m.release(5) == 5 and m.release(np.int64(5)) == 5 and m.release(5.0) == 5
    assert m.release([1, 2]) == [1, 2] and m.release((1, np.int32(2))) == [1, 2]
    assert m.release(np.array([1, 2])) == [1, 2]
    assert m.release(pd.Series([1, 2], index=["x", "y"])) == [1, 2]  # labels dropped
    for bad in (3.7, True, "5", [1.5], [True], {"a": 1}, np.zeros((2, 2)), None, [[1]]):
        with pytest.raises(UnreleasableResultError):
            m.release(bad)


def test_pandas_in_plain_numbers_out() -> None:
    # Issue 28, item 1: labels computed from data are data. A Series or DataFrame used to
    # come back with its index, name and columns; now only the noised numbers come back,
    # in the input's shape (labels come back only when declared, through the guard:
    # tests/unit/test_released_labels.py).
    import pandas as pd

    series = pd.Series([10.0, 20.0, 30.0], index=["north", "south", "east"], name="income")
    noisy = LaplaceMechanism(1, 1, dimension=3).release(series)
    assert type(noisy) is np.ndarray and noisy.shape == (3,) and noisy.dtype == np.float64
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]}, index=["x", "y"])
    noisy_frame = GaussianMechanism(1, "1e-6", 1, dimension=4).release(frame)
    assert type(noisy_frame) is np.ndarray and noisy_frame.shape == (2, 2)
    assert isinstance(LaplaceMechanism(1, 1).release(5.0), float)
