"""The random number of runs of a repeat-and-select charge, and the facts its bounds use.

Papernot and Steinke 2022 ("Hyperparameter tuning with Renyi differential privacy",
ICLR, arXiv:2110.03620, Def. 1 and Sec. 3) draw the number of runs K from a Poisson
distribution of mean mu, or from the truncated negative binomial TNB(eta, gamma):
P[K = k] = binom(k + eta - 1, k) (1 - gamma)^k gamma^eta / (1 - gamma^eta) for k >= 1
and eta > 0 (eta = 1 is the geometric distribution, mean 1 / gamma), and, its eta -> 0
limit, the logarithmic distribution P[K = k] = (1 - gamma)^k / (k ln(1 / gamma)). Like
dp_accounting's ``RepeatAndSelectDpEvent``, a charge states the *mean* and the shape
eta; `tnb_gamma_down` finds gamma from the mean, rounded *down* (a smaller gamma is a
heavier tail and a larger ln(1 / gamma), so every bound that uses it stays valid), and
`tail_up` bounds P[K > t] from above. Floats only; the bounds are rounded by the callers.
"""

from __future__ import annotations

import enum
import math

from scipy import stats

__all__ = ["RunCount", "tail_up", "tnb_gamma_down", "tnb_mean"]

#: Relative margin on a tail probability computed by scipy (its incomplete beta and
#: series are accurate to ~1e-13 relative; this covers that many times over).
_TAIL_MARGIN = 1e-6


class RunCount(enum.StrEnum):
    """How the number of runs of a repeat-and-select charge is drawn.

    ``POISSON``: Poisson of the given mean (Papernot and Steinke 2022, Thm 6).
    ``TRUNCATED_NEGATIVE_BINOMIAL``: TNB(eta, gamma) with shape eta >= 0 and the gamma
    of the given mean (ibid., Def. 1 and Thm 2; eta = 1 geometric, eta = 0 logarithmic).
    """

    POISSON = "poisson"
    TRUNCATED_NEGATIVE_BINOMIAL = "truncated_negative_binomial"


def tnb_mean(gamma: float, eta: float) -> float:
    """The mean of TNB(eta, gamma) (Papernot and Steinke 2022, Def. 1), gamma in (0, 1].

    eta (1 - gamma) / (gamma (1 - gamma^eta)); for eta = 0 its limit
    (1 - gamma) / (gamma ln(1 / gamma)); 1 at gamma = 1.

    Examples:
        >>> tnb_mean(0.25, 1.0)
        4.0
    """
    if gamma >= 1:
        return 1.0
    x = math.log(gamma)  # < 0
    y = eta * x  # (1 - gamma^eta) / eta = -x expm1(y) / y, which is -x as y -> 0
    ratio = math.expm1(y) / y if y != 0 else 1.0
    return -math.expm1(x) / (gamma * -x * ratio)


def tnb_gamma_down(mean: float, eta: float) -> float:
    """A gamma at most the one whose TNB(eta, gamma) has mean ``mean`` (>= 1).

    The mean falls as gamma grows (fewer failures before each success), so the bisection
    keeps the end whose mean is at least ``mean`` (with a relative margin for the float
    mean); for eta = 1 it is 1 / mean rounded down.

    Examples:
        >>> tnb_gamma_down(10.0, 1.0) <= 0.1
        True
        >>> abs(tnb_mean(tnb_gamma_down(10.0, 2.0), 2.0) / 10 - 1) < 1e-9
        True
    """
    if mean <= 1:
        return 1.0
    if eta == 1:
        return math.nextafter(1 / mean, 0.0) * (1 - 1e-15)
    target = mean * (1 + 1e-12)
    lo, hi = 0.0, 1.0  # mean(lo) = inf >= target > 1 = mean(hi)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if tnb_mean(mid, eta) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def tail_up(count: RunCount, mean: float, eta: float, gamma: float, t: int) -> float:
    """An upper bound on P[K > t] for the run count (``gamma`` from `tnb_gamma_down`).

    Examples:
        >>> t = tail_up(RunCount.TRUNCATED_NEGATIVE_BINOMIAL, 4.0, 1.0, 0.25, 2)
        >>> 0.5625 <= t < 0.5626   # geometric: (1 - 1/4)^2, rounded up
        True
    """
    if count is RunCount.POISSON:
        value = float(stats.poisson.sf(t, mean))
    elif gamma >= 1:
        return 0.0  # K = 1
    elif eta == 1:
        value = math.exp(t * math.log1p(-gamma))  # P[K > t] = (1 - gamma)^t
    elif eta == 0:
        value = float(stats.logser.sf(t, 1 - gamma))
    else:
        value = float(stats.nbinom.sf(t, eta, gamma)) / -math.expm1(eta * math.log(gamma))
    return min(1.0, math.nextafter(value * (1 + _TAIL_MARGIN), math.inf))
