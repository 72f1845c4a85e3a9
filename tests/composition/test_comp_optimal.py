"""Optimal composition (Kairouz, Oh and Viswanath 2015, Thm 3.3) against independent computations.

Two independent methods:

1. Direct summation of the theorem's profile with exact binomial coefficients
   (:func:`math.comb`) in 50-digit :mod:`decimal` arithmetic, solved for epsilon by
   bisection in Decimal (no logs of binomials, no floats).
2. For small k, enumerating every outcome of the k-fold product of the randomized-
   response pair P = (e^eps/(1+e^eps), 1/(1+e^eps)), Q = reversed, and summing the
   hockey-stick divergence max(0, P(o) - e^epsilon Q(o)) over the 2^k outcomes.
"""

from __future__ import annotations

import itertools
import math
from decimal import Context, Decimal
from fractions import Fraction

import pytest

from dpaccount.charges import Repeated
from dpaccount.composition.advanced import advanced
from dpaccount.composition.heterogeneous import heterogeneous
from dpaccount.composition.optimal import OptimalRule, optimal, optimal_delta
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError, UnsupportedChargeError

CTX = Context(prec=50)


def dec(value: Fraction) -> Decimal:
    return CTX.divide(Decimal(value.numerator), Decimal(value.denominator))


class DecimalProfile:
    """delta(epsilon) of KOV Thm 3.3 by direct summation with exact binomials."""

    def __init__(self, eps0: Decimal, delta0: Decimal, k: int) -> None:
        self.eps0, self.delta0, self.k = eps0, delta0, k
        e0 = CTX.exp(eps0)
        norm = CTX.power(1 + e0, k)
        powers = [Decimal(1)]
        for _ in range(k):
            powers.append(CTX.multiply(powers[-1], e0))
        # P(l) = C(k,l) e0^(k-l) / (1+e0)^k, Q(l) = C(k,l) e0^l / (1+e0)^k.
        self.p = [CTX.divide(math.comb(k, j) * powers[k - j], norm) for j in range(k + 1)]
        self.q = [CTX.divide(math.comb(k, j) * powers[j], norm) for j in range(k + 1)]

    def delta(self, epsilon: Decimal) -> Decimal:
        total_p = Decimal(0)
        total_q = Decimal(0)
        for j in range(self.k + 1):
            if (self.k - 2 * j) * self.eps0 > epsilon:
                total_p += self.p[j]
                total_q += self.q[j]
        pure = total_p - CTX.exp(epsilon) * total_q
        return 1 - CTX.power(1 - self.delta0, self.k) * (1 - pure)

    def epsilon(self, target: Decimal) -> Decimal:
        lo, hi = Decimal(0), self.k * self.eps0
        if self.delta(lo) <= target:
            return lo
        for _ in range(120):
            mid = (lo + hi) / 2
            if self.delta(mid) <= target:
                hi = mid
            else:
                lo = mid
        return hi


CASES = [
    ("0.1", "0", 1, "1e-5"),
    ("0.1", "0", 10, "1e-5"),
    ("0.1", "0", 1000, "1e-5"),
    ("0.5", "0", 100, "1e-6"),
    ("0.01", "0", 2000, "1e-9"),
    ("1", "1e-6", 50, "1e-3"),
    ("0.05", "1e-7", 500, "1e-4"),
    ("2", "0", 7, "0.01"),
]


@pytest.mark.parametrize(("eps", "delta", "k", "target"), CASES)
def test_optimal_matches_direct_summation(eps: str, delta: str, k: int, target: str) -> None:
    cost = PrivacyCost(eps, delta)
    result = optimal(cost, k, target)
    profile = DecimalProfile(Decimal(eps), Decimal(delta), k)
    ref = profile.epsilon(Decimal(target))
    got = dec(result.epsilon)
    assert result.delta == Fraction(Decimal(target))
    # Agreement to 1e-9 relative, and the returned epsilon is on the safe side:
    # the independently computed delta at it is within the target.
    assert abs(got - ref) <= Decimal("1e-9") * ref
    assert profile.delta(got) <= Decimal(target)


def test_issue_example_is_about_18() -> None:
    # Issue 3: 1000 queries of 0.1 are "about 18" under the exact optimum (KOV 2015).
    result = optimal(PrivacyCost("0.1"), 1000, "1e-5")
    assert 17.5 < result.epsilon < 18.5


@pytest.mark.parametrize(("eps", "k"), [("0.3", 1), ("0.3", 4), ("1.1", 6), ("0.05", 9)])
@pytest.mark.parametrize("epsilon", ["0", "0.2", "0.9", "1.7"])
def test_profile_matches_enumeration_of_randomized_response(eps: str, k: int, epsilon: str) -> None:
    e0 = CTX.exp(Decimal(eps))
    p_one, p_zero = e0 / (1 + e0), 1 / (1 + e0)
    threshold = CTX.exp(Decimal(epsilon))
    brute = Decimal(0)
    for outcome in itertools.product((0, 1), repeat=k):
        ones = sum(outcome)
        p = CTX.power(p_one, ones) * CTX.power(p_zero, k - ones)
        q = CTX.power(p_zero, ones) * CTX.power(p_one, k - ones)
        brute += max(Decimal(0), p - threshold * q)
    got = dec(optimal_delta(PrivacyCost(eps), k, epsilon))
    assert got >= brute
    assert got - brute <= Decimal("1e-12") * max(brute, Decimal("1e-300")) + Decimal("1e-300")


def test_grid_points_match_kov_delta_i() -> None:
    # KOV Thm 3.3 at epsilon = (k - 2i) eps0: delta_i = sum_{l<i} C(k,l)(e^{(k-l)eps0} -
    # e^{(k-2i+l)eps0}) / (1 + e^eps0)^k, computed here in Decimal.
    k, eps0 = 30, Decimal("0.2")
    e0 = CTX.exp(eps0)
    for i in (1, 3, 8, 14):
        ref = sum(
            (
                math.comb(k, j) * (CTX.power(e0, k - j) - CTX.power(e0, k - 2 * i + j))
                for j in range(i)
            ),
            Decimal(0),
        ) / CTX.power(1 + e0, k)
        got = dec(optimal_delta(PrivacyCost("0.2"), k, Fraction((k - 2 * i) * 2, 10)))
        assert got >= ref
        assert got - ref <= Decimal("1e-10") * ref


def _log_delta_lgamma(eps0: float, k: int, epsilon: float) -> float:
    """A second, pure-Python evaluation (math.lgamma, fsum) for large k."""
    log_norm = k * math.log1p(math.exp(-eps0))
    terms = []
    for j in range(k + 1):
        gap = (k - 2 * j) * eps0
        if gap <= epsilon:
            break
        log_c = math.lgamma(k + 1) - math.lgamma(j + 1) - math.lgamma(k - j + 1)
        terms.append(log_c - j * eps0 - log_norm + math.log(-math.expm1(epsilon - gap)))
    top = max(terms)
    return top + math.log(math.fsum(math.exp(t - top) for t in terms))


def test_large_k_is_stable_and_tight() -> None:
    k = 100_000
    result = optimal(PrivacyCost("0.01"), k, "1e-6")
    log_delta = _log_delta_lgamma(0.01, k, float(result.epsilon))
    # Within the target (to lgamma's accuracy) and tight: slightly less epsilon fails.
    assert log_delta <= math.log(1e-6) + 1e-6
    below = _log_delta_lgamma(0.01, k, float(result.epsilon) * (1 - 1e-6))
    assert below > math.log(1e-6)
    # And well below the advanced bound at the same total delta.
    assert result.epsilon < advanced(PrivacyCost("0.01"), k, "1e-6").epsilon


def test_ordering_optimal_kov_drv() -> None:
    for eps, k in (("0.1", 1000), ("0.5", 40), ("0.02", 5000)):
        cost = PrivacyCost(eps)
        opt = optimal(cost, k, "1e-6")
        assert opt.epsilon <= heterogeneous([cost] * k, "1e-6").epsilon
        assert opt.epsilon <= advanced(cost, k, "1e-6").epsilon
        assert opt.epsilon <= k * cost.epsilon


def test_edge_cases() -> None:
    assert optimal(PrivacyCost(0), 10, "1e-5") == PrivacyCost(0, "1e-5")
    assert optimal(PrivacyCost(1), 1, 0).epsilon == 1  # pure: no better than eps0
    assert optimal(PrivacyCost(1), 7, 0).epsilon == 7
    with pytest.raises(InvalidCostError, match="no epsilon reaches it") as info:
        optimal(PrivacyCost("0.1", "1e-6"), 100, "1e-5")
    assert info.value.field == "target_delta"
    with pytest.raises(InvalidCostError):
        optimal(PrivacyCost("0.1"), 0, "1e-5")
    with pytest.raises(InvalidCostError):
        optimal(PrivacyCost("0.1"), 3, 1)


def test_optimal_rule_over_a_plan() -> None:
    rule = OptimalRule(plan=(PrivacyCost("0.1"), 1000), budget=Budget(20, "1e-5"))
    assert rule.target_delta == Fraction(1, 10**5)
    state = rule.extend(rule.start(), Repeated(PrivacyCost("0.1"), 500))
    assert rule.total(state) == optimal(PrivacyCost("0.1"), 500, "1e-5")
    assert rule.admits(state, Budget(20, "1e-5"))
    full = rule.extend(state, Repeated(PrivacyCost("0.1"), 500))
    assert not rule.admits(full, Budget(17, "1e-5"))
    with pytest.raises(UnsupportedChargeError):
        rule.extend(full, PrivacyCost("0.1"))
    with pytest.raises(ConfigError, match="#P-hard"):
        OptimalRule(plan=[PrivacyCost(1), PrivacyCost(2)], target_delta="1e-5")
    with pytest.raises(ConfigError, match="target_delta"):
        OptimalRule(plan=(PrivacyCost(1), 2))


def test_only_the_terms_near_the_boundary_are_summed() -> None:
    # O(sqrt(k)) terms, the rest bounded by a Chernoff bound (not a timing assertion: the
    # structure that makes k = 10^7 take milliseconds)
    from dpaccount.composition.optimal import _Profile

    for k in (10**5, 10**7):
        profile = _Profile(0.001, k, floor_log=math.log(1e-6) - 30)
        assert len(profile.g) < 100 * math.sqrt(k)
        assert profile.log_tail <= math.log(1e-6) - 30


def test_large_k_windowed_sum_matches_the_full_sum() -> None:
    # k = 10^6: the certified answer against the whole profile summed term by term
    k = 10**6
    result = optimal(PrivacyCost("0.001"), k, "1e-6")
    log_delta = _log_delta_lgamma(0.001, k, float(result.epsilon))
    assert log_delta <= math.log(1e-6) + 1e-6
    assert _log_delta_lgamma(0.001, k, float(result.epsilon) * (1 - 1e-6)) > math.log(1e-6)


def test_admits_agrees_with_the_total_at_every_position() -> None:
    # The plan (400 x 0.1) does not fit (10, 1e-6), so admits() uses the boundary found
    # once by bisection; it must agree with total().fits() everywhere.
    budget = Budget(10, "1e-6")
    rule = OptimalRule(plan=(PrivacyCost("0.1"), 400), budget=budget)
    state = rule.start()
    answers = []
    for _ in range(400):
        state = rule.extend(state, PrivacyCost("0.1"))
        answers.append(rule.admits(state, budget))
        assert answers[-1] == rule.total(state).fits(budget)
    assert answers[0] and not answers[-1]
    assert answers == sorted(answers, reverse=True)  # admitted, then refused
