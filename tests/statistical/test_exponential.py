"""Statistical tests of the exact exponential mechanism.

False-positive rate: alpha = 1e-6 for every test; seeds fixed via ``RandomSource.seeded``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from _audit import Pmf, Sampler, chi_square_gof, run_audit

from dpaccount.mechanisms import ExponentialMechanism, RandomSource

ALPHA = 1e-6


def softmax_pmf(weights_exponent: list[float]) -> Pmf:
    """P[i] = exp(x_i) / sum_j exp(x_j), computed directly (the exponents are small)."""
    w = [math.exp(x) for x in weights_exponent]
    total = math.fsum(w)
    probs = np.array([x / total for x in w])

    def pmf(k: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return probs[k]

    return pmf


@pytest.mark.parametrize("monotonic", [False, True])
def test_selection_distribution(monotonic: bool) -> None:
    utilities = [0.0, 1.0, 2.5, 4.0, -3.0, 2.0]
    eps, sens = 1.5, 2.0
    mech = ExponentialMechanism(eps, sens, monotonic=monotonic, rng=RandomSource.seeded(31))
    picks = [mech.release(utilities) for _ in range(20_000)]
    coef = eps / (sens if monotonic else 2 * sens)
    res = chi_square_gof(
        picks, softmax_pmf([coef * u for u in utilities]), (0, len(utilities) - 1), alpha=ALPHA
    )
    assert res.passed, res


def test_exact_with_huge_utility_gaps() -> None:
    """Utilities 10^6 apart: float weights would underflow; the exact sampler still works."""
    mech = ExponentialMechanism(1, 1, rng=RandomSource.seeded(32))
    picks = {mech.release([0.0, 1e6, 1e6 - 2.0]) for _ in range(200)}
    assert picks <= {1, 2} and 1 in picks


# --- epsilon audit ---------------------------------------------------------------------------
# K candidates. D: all utilities 0. D': candidate 0 up by the sensitivity, the others down
# by it (allowed by sensitivity 1, not monotone). P_D'(0) / P_D(0) = K e^(eps/2) /
# (e^(eps/2) + (K - 1) e^(-eps/2)), close to e^eps for large K.
K = 20
U_D = [0] * K
U_D2 = [1] + [-1] * (K - 1)
N = 20_000
EVENTS = {"pick 0": lambda x: x == 0, "pick 1": lambda x: x == 1}


def _sampler(mech: ExponentialMechanism, utilities: list[int]) -> Sampler:
    return lambda n: np.array([mech.release(utilities) for _ in range(n)])


def test_exponential_audit_respects_epsilon() -> None:
    mech = ExponentialMechanism(1, 1, rng=RandomSource.seeded(33))
    res = run_audit(_sampler(mech, U_D), _sampler(mech, U_D2), N, EVENTS, alpha=ALPHA)
    assert res.epsilon_lower_bound <= 1.0, res
    assert res.epsilon_lower_bound > 0.5, res


class _NoFactorTwo(ExponentialMechanism):
    """Broken on purpose: uses exp(eps u / Δ) for a non-monotone utility."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._coefficient = self._epsilon / self._sensitivity


def test_exponential_audit_catches_missing_factor_two() -> None:
    mech = _NoFactorTwo(1, 1, rng=RandomSource.seeded(34))
    assert mech.charge.epsilon == Fraction(1)
    res = run_audit(_sampler(mech, U_D), _sampler(mech, U_D2), N, EVENTS, alpha=ALPHA)
    assert res.epsilon_lower_bound > 1.0, res
