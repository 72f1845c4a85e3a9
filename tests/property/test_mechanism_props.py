"""Property-based tests of the mechanisms' invariants (hypothesis)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpaccount.errors import InvalidCostError
from dpaccount.mechanisms import (
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomSource,
)
from dpaccount.mechanisms._sampling import (
    floor_sqrt_fraction,
    power_of_two_at_most,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    to_lattice,
)

positive = st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(1000))
finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
invalid_numbers = st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, True, "abc", None])


@settings(max_examples=100, deadline=None)
@given(sens=positive, dim=st.integers(1, 6), data=st.data())
def test_laplace_lattice_sensitivity_covers_rounding(
    sens: Fraction, dim: int, data: st.DataObject
) -> None:
    """Neighbouring answers (L1 distance <= sensitivity) land within S lattice steps."""
    m = LaplaceMechanism(
        1,
        sens,
        dimension=dim,
        granularity=data.draw(
            st.one_of(st.none(), st.fractions(min_value=Fraction(1, 64), max_value=Fraction(4)))
        ),
    )
    a = np.array(data.draw(st.lists(finite, min_size=dim, max_size=dim)))
    direction = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=dim, max_size=dim)))
    norm = float(np.abs(direction).sum())
    assume(norm > 0)
    b = a + direction / norm * float(sens) * (1 - 1e-12)
    assume(float(np.abs(b - a).sum()) <= float(sens))
    ka, _ = to_lattice(a, m.granularity, dim)
    kb, _ = to_lattice(b, m.granularity, dim)
    assert sum(abs(x - y) for x, y in zip(ka, kb, strict=True)) <= m.lattice_sensitivity


@settings(max_examples=60, deadline=None)
@given(sens=positive, dim=st.integers(2, 5), data=st.data())
def test_gaussian_lattice_l2_sensitivity_covers_rounding(
    sens: Fraction, dim: int, data: st.DataObject
) -> None:
    m = GaussianMechanism.from_sigma(10 * sens, sens, dimension=dim)
    a = np.array(data.draw(st.lists(st.floats(-1e6, 1e6), min_size=dim, max_size=dim)))
    direction = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=dim, max_size=dim)))
    norm = float(np.sqrt((direction**2).sum()))
    assume(norm > 1e-6)
    b = a + direction / norm * float(sens) * (1 - 1e-9)
    ka, _ = to_lattice(a, m.granularity, dim)
    kb, _ = to_lattice(b, m.granularity, dim)
    assert sum((x - y) ** 2 for x, y in zip(ka, kb, strict=True)) <= m._shift2


@settings(max_examples=100, deadline=None)
@given(eps=positive, sens=positive, dim=st.integers(1, 8))
def test_laplace_charge_is_exact_and_noise_never_below_continuous(
    eps: Fraction, sens: Fraction, dim: int
) -> None:
    m = LaplaceMechanism(eps, sens, dimension=dim)
    assert m.charge.cost.epsilon == eps and m.charge.cost.delta == 0
    assert m.lattice_sensitivity / m.lattice_scale == eps  # S / b = epsilon exactly
    assert Fraction(m.scale) >= sens / eps
    assert Fraction(m.scale) <= sens / eps * Fraction(1003, 1000)  # default lattice is fine


@settings(max_examples=40, deadline=None)
@given(
    eps=st.fractions(min_value=Fraction(1, 20), max_value=Fraction(8)),
    delta_exp=st.integers(3, 12),
    sens=st.fractions(min_value=Fraction(1, 10), max_value=Fraction(100)),
)
def test_gaussian_charge_never_exceeds_request_and_beats_continuous(
    eps: Fraction, delta_exp: int, sens: Fraction
) -> None:
    delta = Fraction(1, 10**delta_exp)
    m = GaussianMechanism(eps, delta, sens)
    assert m.charge.epsilon == eps
    assert 0 < m.charge.delta <= delta
    # sigma is at least the continuous Balle-Wang sigma for the declared sensitivity
    mu = float(sens) / m.sigma
    e = float(eps)
    from scipy.stats import norm

    bw = norm.cdf(mu / 2 - e / mu) - math.exp(e) * norm.cdf(-mu / 2 - e / mu)
    assert bw <= float(delta) * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(bad=invalid_numbers)
def test_invalid_parameters_are_refused(bad: object) -> None:
    for build in (
        lambda: LaplaceMechanism(bad, 1),
        lambda: LaplaceMechanism(1, bad),
        lambda: GaussianMechanism(bad, "1e-5", 1),
        lambda: GaussianMechanism(1, "1e-5", bad),
        lambda: ExponentialMechanism(bad, 1),
        lambda: ExponentialMechanism(1, bad),
    ):
        try:
            build()
        except InvalidCostError:
            continue
        raise AssertionError(f"accepted {bad!r}")


@settings(max_examples=100, deadline=None)
@given(
    utilities=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=12),
    shift=st.floats(-1e3, 1e3),
    seed=st.integers(0, 2**32),
)
def test_exponential_shift_invariance_and_range(
    utilities: list[float], shift: float, seed: int
) -> None:
    m = ExponentialMechanism(1, 1, rng=RandomSource.seeded(seed))
    p = m.probabilities(utilities)
    assert abs(math.fsum(p.tolist()) - 1.0) < 1e-9
    q = m.probabilities([u + shift for u in utilities])
    assert np.allclose(p, q, atol=1e-6)
    assert 0 <= m.release(utilities) < len(utilities)


@settings(max_examples=200, deadline=None)
@given(value=st.fractions(min_value=0, max_value=Fraction(10**12)))
def test_floor_sqrt_fraction(value: Fraction) -> None:
    r = floor_sqrt_fraction(value)
    assert r * r <= value < (r + 1) * (r + 1)


@settings(max_examples=200, deadline=None)
@given(value=st.fractions(min_value=Fraction(1, 10**9), max_value=Fraction(10**9)))
def test_power_of_two_at_most(value: Fraction) -> None:
    p = power_of_two_at_most(value)
    assert p <= value < 2 * p
    assert (p.numerator & (p.numerator - 1)) == 0 and (p.denominator & (p.denominator - 1)) == 0


@settings(max_examples=100, deadline=None)
@given(
    gamma=st.fractions(min_value=0, max_value=Fraction(50)),
    sigma2=st.fractions(min_value=Fraction(1, 100), max_value=Fraction(10**6)),
    seed=st.integers(0, 2**32),
)
def test_samplers_return_the_right_types(gamma: Fraction, sigma2: Fraction, seed: int) -> None:
    rng = RandomSource.seeded(seed)
    assert isinstance(sample_bernoulli_exp(gamma, rng), bool)
    assert isinstance(sample_discrete_gaussian(sigma2, rng), int)
