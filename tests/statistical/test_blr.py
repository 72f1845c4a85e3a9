"""Statistical and functional tests of the BLR (SmallDB) mechanism.

False-positive rate: the goodness-of-fit test and the audits run at alpha = 1e-6 (a
correct implementation fails with probability at most 1e-6 for a fresh seed); seeds are
fixed through the test-only ``RandomSource.seeded``.

Expected probabilities are computed independently in the test from the definition
(Dwork and Roth 2014, Sec. 4.1): enumerate the multisets with itertools, utility
u = -max_i |q_i(D) - (n / m) q_i(D^)|, probability ∝ exp(epsilon u / 2).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _audit import chi_square_gof, run_audit

from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms import RandomSource
from dpaccount.mechanisms.blr import BLRMechanism, candidate_count
from dpaccount.mechanisms.exponential import ExponentialMechanism

ALPHA = 1e-6
DOMAIN = [0, 1, 2]
QUERIES: list[Callable[[int], bool]] = [lambda x: x == 0, lambda x: x == 1]
N_DECLARED, M = 4, 2
# Neighbours (substitution of one record) found by a search over all size-4 datasets as
# the pair where a missing factor 2 in the exponent shows most: the broken variant's
# true epsilon there is 3.29 against the claimed 2.
D1 = [1, 1, 2, 2]
D2 = [1, 1, 2, 1]
EPS = 2.0


def _expected(data: list[int], epsilon: float) -> list[float]:
    cands = list(itertools.combinations_with_replacement(range(len(DOMAIN)), M))
    qd = [sum(1 for x in data if q(x)) for q in QUERIES]
    utils = []
    for c in cands:
        qc = [sum(1 for i in c if q(DOMAIN[i])) for q in QUERIES]
        utils.append(-max(abs(a - N_DECLARED / M * b) for a, b in zip(qd, qc, strict=True)))
    w = [math.exp(epsilon * u / 2) for u in utils]
    return [x / sum(w) for x in w]


def _index_sampler(mech: BLRMechanism, data: list[int]) -> Any:
    cands = list(itertools.combinations_with_replacement(DOMAIN, M))
    index = {c: i for i, c in enumerate(cands)}

    def sample(n: int) -> npt.NDArray[np.int64]:
        return np.array([index[mech.release(data)] for _ in range(n)], dtype=np.int64)

    return sample


def _events() -> dict[str, Any]:
    k = candidate_count(len(DOMAIN), M)
    return {f"out=={j}": (lambda x, j=j: x == j) for j in range(k)}


def _blr(seed: int) -> BLRMechanism:
    return BLRMechanism(
        EPS, DOMAIN, QUERIES, size=M, dataset_size=N_DECLARED, rng=RandomSource.seeded(seed)
    )


def test_selection_matches_the_exponential_mechanism_exactly() -> None:
    mech = _blr(1)
    samples = _index_sampler(mech, D2)(20_000)
    probs = np.asarray(_expected(D2, EPS))

    def pmf(x: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return probs[x]

    assert chi_square_gof(samples, pmf, (0, probs.size - 1), alpha=ALPHA).passed


def test_utilities_match_the_definition() -> None:
    mech = _blr(0)
    data = [0, 0, 1, 2, 2, 2]
    cands = list(itertools.combinations_with_replacement(range(3), M))
    qd = [sum(1 for x in data if q(x)) for q in QUERIES]
    want = [
        -max(abs(a - N_DECLARED / M * b) for a, b in zip(
            qd, [sum(1 for i in c if q(i)) for q in QUERIES], strict=True))
        for c in cands
    ]
    assert [float(u) for u in mech.utilities(data)] == want


def test_epsilon_audit_passes() -> None:
    mech = _blr(2)
    res = run_audit(_index_sampler(mech, D1), _index_sampler(mech, D2), 20_000, _events(),
                    alpha=ALPHA)
    assert res.epsilon_lower_bound <= float(mech.charge.epsilon)


class _MissingFactorTwo(BLRMechanism):
    """Mutant: weight exp(epsilon u) instead of exp(epsilon u / 2) (as if the utility
    were monotone), still charging epsilon."""

    def __init__(self, seed: int) -> None:
        super().__init__(EPS, DOMAIN, QUERIES, size=M, dataset_size=N_DECLARED)
        self._exp = ExponentialMechanism(EPS, 1, monotonic=True, rng=RandomSource.seeded(seed))


def test_epsilon_audit_catches_a_missing_factor_two() -> None:
    mech = _MissingFactorTwo(3)
    res = run_audit(_index_sampler(mech, D1), _index_sampler(mech, D2), 20_000, _events(),
                    alpha=ALPHA)
    assert res.epsilon_lower_bound > float(mech.charge.epsilon)


def test_eight_element_domain_with_five_queries_completes() -> None:
    queries = [lambda x, t=t: x < t for t in (2, 4, 6)] + [
        lambda x: x % 2 == 0,
        lambda x: x in (1, 5),
    ]
    mech = BLRMechanism(1, range(8), queries, size=8, dataset_size=100)
    assert mech.candidate_count == math.comb(15, 8)
    data = [x for x in range(8) for _ in range(12)] + [0, 0, 0, 0]
    synthetic = mech.release(data)
    assert len(synthetic) == 8 and set(synthetic) <= set(range(8))
    assert mech.answers(synthetic).shape == (5,)


@pytest.mark.parametrize(("domain_size", "size"), [(10**6, 1000), (50, 50), (2**40, 3)])
def test_domains_too_large_are_refused_with_a_typed_error(domain_size: int, size: int) -> None:
    with pytest.raises(ConfigError, match="candidate datasets"):
        BLRMechanism(1, range(domain_size), [[1] * 3], size=size, dataset_size=10)


def test_candidate_count_is_the_binomial() -> None:
    for d in range(1, 7):
        for m in range(1, 7):
            assert candidate_count(d, m) == math.comb(d + m - 1, m)
            assert candidate_count(d, m) == sum(
                1 for _ in itertools.combinations_with_replacement(range(d), m))


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(InvalidCostError):
        BLRMechanism(0, DOMAIN, QUERIES, size=2, dataset_size=4)
    with pytest.raises(InvalidCostError):
        BLRMechanism(1, DOMAIN, QUERIES, size=0, dataset_size=4)
    with pytest.raises(InvalidCostError):
        BLRMechanism(1, DOMAIN, [[1, 0]], size=2, dataset_size=4)  # wrong width
    with pytest.raises(ConfigError):
        BLRMechanism(1, [0, 0, 1], QUERIES, size=2, dataset_size=4)  # not distinct
