"""Statistical tests of randomized response (one bit and k categories).

False-positive rate: every goodness-of-fit test and every audit below runs at
alpha = 1e-6 (a correct implementation fails it with probability at most 1e-6 for a
fresh seed). Seeds are fixed through the test-only ``RandomSource.seeded``.
Expected probabilities are derived independently from the definition of k-RR:
p = e^eps / (e^eps + k - 1), q = 1 / (e^eps + k - 1) (Kairouz, Oh and Viswanath 2016).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _audit import chi_square_gof, run_audit

from dpaccount.errors import InvalidCostError, UnreleasableResultError
from dpaccount.mechanisms import RandomSource
from dpaccount.mechanisms.randomized_response import RandomizedResponseMechanism

ALPHA = 1e-6
N = 20_000


def _events(k: int) -> dict[str, Any]:
    return {f"out=={j}": (lambda x, j=j: x == j) for j in range(k)}


@pytest.mark.parametrize(("epsilon", "k", "true"), [(1.0, 2, 1), (0.5, 4, 2), (2.0, 5, 0)])
def test_output_distribution_matches_krr(epsilon: float, k: int, true: int) -> None:
    rr = RandomizedResponseMechanism(epsilon, k, rng=RandomSource.seeded(3))
    out = rr.release_many(np.full(N, true))
    e = math.exp(epsilon)
    p, q = e / (e + k - 1), 1 / (e + k - 1)

    def pmf(x: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return np.where(x == true, p, q)

    assert chi_square_gof(out, pmf, (0, k - 1), alpha=ALPHA).passed


@pytest.mark.parametrize(("epsilon", "k"), [(1.0, 2), (1.0, 4)])
def test_epsilon_audit_passes_for_the_real_mechanism(epsilon: float, k: int) -> None:
    rr = RandomizedResponseMechanism(epsilon, k, rng=RandomSource.seeded(5))
    res = run_audit(
        lambda n: rr.release_many(np.zeros(n, dtype=np.int64)),
        lambda n: rr.release_many(np.ones(n, dtype=np.int64)),
        N,
        _events(k),
        alpha=ALPHA,
    )
    assert res.epsilon_lower_bound <= float(rr.charge.epsilon)
    # The audit has power: it certifies most of the true epsilon.
    assert res.epsilon_lower_bound > 0.8 * epsilon


class _BinaryProbabilitiesForK(RandomizedResponseMechanism):
    """Mutant: uses the binary keep probability e^eps / (e^eps + 1) for k categories
    (the "k - 1" forgotten), but still charges eps."""

    def __init__(self, epsilon: float, k: int, rng: Any) -> None:
        super().__init__(epsilon, k, rng=rng)
        e = Fraction(math.exp(epsilon))
        self._setup(e / (e + 1), k, rng)
        self._charge = RandomizedResponseMechanism(epsilon, k).charge


class _DoubledEpsilon(RandomizedResponseMechanism):
    """Mutant: randomizes with 2 eps (e.g. a sensitivity of 2 ignored) but charges eps."""

    def __init__(self, epsilon: float, k: int, rng: Any) -> None:
        super().__init__(2 * epsilon, k, rng=rng)
        self._charge = RandomizedResponseMechanism(epsilon, k).charge


@pytest.mark.parametrize(
    ("mutant", "k"), [(_BinaryProbabilitiesForK, 4), (_DoubledEpsilon, 2)]
)
def test_epsilon_audit_catches_broken_variants(mutant: type, k: int) -> None:
    rr = mutant(1.0, k, RandomSource.seeded(9))
    res = run_audit(
        lambda n: rr.release_many(np.zeros(n, dtype=np.int64)),
        lambda n: rr.release_many(np.ones(n, dtype=np.int64)),
        N,
        _events(k),
        alpha=ALPHA,
    )
    assert res.epsilon_lower_bound > float(rr.charge.epsilon)


def test_charge_is_the_log_ratio_actually_implemented() -> None:
    for eps in (Fraction(1, 10), Fraction(1), Fraction(7, 3)):
        for k in (2, 3, 10):
            rr = RandomizedResponseMechanism(eps, k)
            ratio = rr.keep_probability / rr.other_probability  # exact
            assert math.log(ratio) <= float(rr.charge.epsilon) <= float(eps)
            assert rr.keep_probability + (k - 1) * rr.other_probability == 1
            assert float(eps) - float(rr.charge.epsilon) < 1e-12


def test_from_keep_probability_charges_ln_three() -> None:
    rr = RandomizedResponseMechanism.from_keep_probability(Fraction(3, 4), 2)
    # ln((3/4) / (1/4)) = ln 3, rounded up but within 1e-12.
    assert math.log(3) <= float(rr.charge.epsilon) < math.log(3) + 1e-12


@pytest.mark.parametrize(
    ("p", "k"), [("0.5", 2), ("0.2", 5), ("1", 2), ("nan", 2), ("0.9", 1)]
)
def test_invalid_parameters_are_refused(p: str, k: int) -> None:
    with pytest.raises(InvalidCostError):
        RandomizedResponseMechanism.from_keep_probability(p, k)


def test_invalid_values_are_refused() -> None:
    rr = RandomizedResponseMechanism(1, 3)
    for bad in (3, -1, 1.5, True, "a"):
        with pytest.raises(UnreleasableResultError):
            rr.release(bad)


def test_estimate_counts_is_unbiased() -> None:
    # 30 000 reports of true counts (10 000, 20 000, 0); the estimate's standard deviation
    # per category is below sqrt(n q (1 - q)) / (p - q) ~ 200; a 6-sd band fails with
    # probability < 1e-8.
    rr = RandomizedResponseMechanism(1, 3, rng=RandomSource.seeded(2))
    truth = np.repeat([0, 1], [10_000, 20_000])
    est = rr.estimate_counts(rr.release_many(truth))
    e = math.e
    p, q = e / (e + 2), 1 / (e + 2)
    sd = math.sqrt(30_000 * q * (1 - q)) / (p - q) + math.sqrt(30_000 * p * (1 - p)) / (p - q)
    assert np.all(np.abs(est - np.array([10_000, 20_000, 0])) < 6 * sd)
