"""Statistical tests of the exact samplers and the Laplace mechanism.

False-positive rate: every goodness-of-fit test and every audit below is run at
alpha = 1e-6 (a correct implementation fails it with probability at most 1e-6 for a
fresh seed); seeds are fixed through the test-only ``RandomSource.seeded`` so the suite
is deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from _audit import Pmf, Sampler, chi_square_gof, run_audit, threshold_events

from dpaccount.mechanisms import LaplaceMechanism, RandomSource
from dpaccount.mechanisms._sampling import (
    discrete_laplace_vector,
    sample_bernoulli,
    sample_bernoulli_exp,
)

ALPHA = 1e-6


def discrete_laplace_pmf(scale: float) -> Pmf:
    """P[Y = k] = (1 - q) / (1 + q) q^|k|, q = exp(-1/scale): derived from the geometric
    series sum_k q^|k| = (1 + q) / (1 - q)."""
    q = math.exp(-1.0 / scale)

    def pmf(k: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return (1 - q) / (1 + q) * q ** np.abs(k).astype(np.float64)

    return pmf


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 2)])
def test_bernoulli_exp_matches_exp_minus_gamma(gamma: Fraction) -> None:
    rng = RandomSource.seeded(11)
    n = 20_000
    hits = sum(sample_bernoulli_exp(gamma, rng) for _ in range(n))
    p = math.exp(-float(gamma))
    res = chi_square_gof(
        [1] * hits + [0] * (n - hits),
        lambda k: np.where(k == 1, p, 1 - p),
        (0, 1),
        alpha=ALPHA,
    )
    assert res.passed, res


def test_bernoulli_rational() -> None:
    rng = RandomSource.seeded(12)
    n = 20_000
    hits = sum(sample_bernoulli(Fraction(2, 7), rng) for _ in range(n))
    res = chi_square_gof(
        [1] * hits + [0] * (n - hits),
        lambda k: np.where(k == 1, 2 / 7, 5 / 7),
        (0, 1),
        alpha=ALPHA,
    )
    assert res.passed, res


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(40, 3)])
def test_discrete_laplace_sampler_fits(scale: Fraction) -> None:
    draws = discrete_laplace_vector(scale, 20_000, RandomSource.seeded(13))
    width = int(30 * float(scale)) + 5
    res = chi_square_gof(draws, discrete_laplace_pmf(float(scale)), (-width, width), alpha=ALPHA)
    assert res.passed, res


def test_chi_square_rejects_wrong_scale() -> None:
    """Power check of the harness: scale 3 samples are not scale 3.5."""
    draws = discrete_laplace_vector(Fraction(3), 20_000, RandomSource.seeded(14))
    res = chi_square_gof(draws, discrete_laplace_pmf(3.5), (-120, 120), alpha=ALPHA)
    assert not res.passed


def test_laplace_mechanism_output_distribution() -> None:
    # granularity 1, sensitivity 1: lattice sensitivity floor(1/1) + 1 = 2, b = 2 / eps.
    mech = LaplaceMechanism(1, 1, granularity=1, rng=RandomSource.seeded(15))
    assert mech.lattice_scale == 2
    outs = np.array([mech.release(3.0) for _ in range(20_000)]) - 3.0
    assert np.all(outs == np.round(outs))
    res = chi_square_gof(outs.astype(np.int64), discrete_laplace_pmf(2.0), (-60, 60), alpha=ALPHA)
    assert res.passed, res


# --- epsilon audit -------------------------------------------------------------------------
# D and D' answers 0.5 and 1.5 differ by the sensitivity 1, and round-half-to-even puts
# them on lattice points 0 and 2: the worst case the lattice sensitivity S = 2 accounts for.
D, D2 = 0.5, 1.5
N = 20_000
EVENTS = threshold_events([-1.0, 0.0, 1.0, 2.0])


def _sampler(mech: LaplaceMechanism, value: float) -> Sampler:
    return lambda n: np.array([mech.release(value) for _ in range(n)])


def test_laplace_audit_respects_epsilon() -> None:
    mech = LaplaceMechanism(1, 1, granularity=1, rng=RandomSource.seeded(16))
    res = run_audit(_sampler(mech, D), _sampler(mech, D2), N, EVENTS, alpha=ALPHA)
    assert res.epsilon_lower_bound <= float(mech.charge.cost.epsilon), res
    # The audit is informative: it certifies a good part of the true epsilon.
    assert res.epsilon_lower_bound > 0.6, res


class _HalfNoiseLaplace(LaplaceMechanism):
    """Broken on purpose: half the noise scale (the real epsilon is doubled)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lattice_scale /= 2


class _OffByOneLaplace(LaplaceMechanism):
    """Broken on purpose: forgets the rounding term (S = floor(Δ/g) instead of + 1)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lattice_sensitivity -= 1
        self._lattice_scale = Fraction(self._lattice_sensitivity) / self._epsilon


@pytest.mark.parametrize("broken", [_HalfNoiseLaplace, _OffByOneLaplace])
def test_laplace_audit_catches_broken_variant(broken: type[LaplaceMechanism]) -> None:
    mech = broken(1, 1, granularity=1, rng=RandomSource.seeded(17))
    assert mech.charge.cost.epsilon == 1  # it still claims epsilon = 1
    res = run_audit(_sampler(mech, D), _sampler(mech, D2), N, EVENTS, alpha=ALPHA)
    assert res.epsilon_lower_bound > float(mech.charge.cost.epsilon), res
