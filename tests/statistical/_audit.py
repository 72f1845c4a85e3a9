"""Reusable statistical checks for mechanisms: goodness of fit and epsilon-ratio audits.

Two kinds of check, each at a stated false-positive rate ``alpha`` (the probability that
a *correct* implementation fails the check):

1. Goodness of fit of samples against an exact distribution:
   :func:`chi_square_gof` for a discrete distribution (integer support, bins merged until
   every expected count is at least ``min_expected``) and :func:`ks_gof` for a continuous
   one (Kolmogorov-Smirnov).
2. An epsilon-ratio audit on neighbouring inputs (:func:`epsilon_lower_bound`,
   :func:`run_audit`): for each fixed event S, one-sided Clopper-Pearson bounds give
   p_lo <= P[M(D) in S] and q_hi >= P[M(D') in S]; if M is (epsilon, delta)-DP then
   ln((p_lo - delta) / q_hi) <= epsilon. Every event is tried in both directions, and a
   Bonferroni correction over all (event, direction) pairs and both bounds keeps the
   probability that the reported lower bound exceeds the true epsilon at most ``alpha``.
   Events must be fixed before the samples are drawn (never chosen from the samples).

A test asserts ``lower_bound <= claimed epsilon`` for the real mechanism, and
``lower_bound > claimed epsilon`` for a deliberately broken variant (a mutation test that
shows the audit has power).

Seeds: statistical tests draw through ``RandomSource.seeded(...)`` (test-only) so that
the suite is deterministic; the stated false-positive rates are what a fresh seed would
give.

Example:
    >>> import numpy as np
    >>> lo, hi = clopper_pearson(50, 100, 0.05)
    >>> 0.39 < lo < 0.5 < hi < 0.61
    True
    >>> rng = np.random.default_rng(0)
    >>> a = rng.laplace(0.0, 1.0, 20000)
    >>> b = rng.laplace(1.0, 1.0, 20000)
    >>> res = epsilon_lower_bound(a, b, {"x<=0": lambda x: x <= 0}, alpha=1e-6)
    >>> 0.5 < res.epsilon_lower_bound <= 1.0        # true epsilon is 1
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = [
    "AuditResult",
    "Event",
    "GofResult",
    "Pmf",
    "Sampler",
    "chi_square_gof",
    "clopper_pearson",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "ks_gof",
    "run_audit",
    "threshold_events",
]

#: A predicate on a batch of outputs (first axis = repetitions).
Event = Callable[[npt.NDArray[Any]], npt.NDArray[np.bool_]]
#: A vectorised probability mass function on integer points.
Pmf = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]
#: ``sampler(n)`` returns n independent outputs of a mechanism on a fixed input.
Sampler = Callable[[int], npt.NDArray[Any]]

#: The default false-positive rate of every check in the statistical suite.
DEFAULT_ALPHA = 1e-6


# ---------------------------------------------------------------------------------------
# Goodness of fit
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GofResult:
    """Outcome of a goodness-of-fit test.

    Attributes:
        statistic: The chi-square or KS statistic.
        p_value: Its p-value under the null hypothesis (samples follow the distribution).
        alpha: The false-positive rate the test is run at.
        dof: Degrees of freedom (chi-square) or 0 (KS).
        bins: Number of bins used (chi-square) or 0.
    """

    statistic: float
    p_value: float
    alpha: float
    dof: int = 0
    bins: int = 0

    @property
    def passed(self) -> bool:
        """True when the samples are consistent with the distribution at ``alpha``."""
        return self.p_value >= self.alpha


def chi_square_gof(
    samples: Sequence[int] | npt.NDArray[Any],
    pmf: Pmf,
    support: tuple[int, int],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_expected: float = 10.0,
) -> GofResult:
    """Chi-square test of integer samples against an exact probability mass function.

    Args:
        samples: Integer draws.
        pmf: Vectorised exact pmf: an int array of points to their probabilities.
        support: ``(lo, hi)``: the pmf is evaluated on ``lo..hi``; the mass outside
            (one minus the sum) forms one more bin with every sample outside the range.
        alpha: False-positive rate (reject a correct sampler with probability alpha).
        min_expected: Adjacent values are merged until each bin expects this many.

    Returns:
        The test result; ``.passed`` is the verdict.
    """
    x = np.asarray([int(s) for s in samples], dtype=np.int64)
    n = x.size
    lo, hi = support
    points = np.arange(lo, hi + 1, dtype=np.int64)
    probs = np.asarray(pmf(points), dtype=np.float64)
    outside_p = max(0.0, 1.0 - math.fsum(probs.tolist()))
    inside = (x >= lo) & (x <= hi)
    counts = np.bincount(x[inside] - lo, minlength=points.size).astype(np.float64)
    outside_count = float(n - int(inside.sum()))

    exp_bins: list[float] = []
    obs_bins: list[float] = []
    acc_e = acc_o = 0.0
    for e, o in zip((probs * n).tolist(), counts.tolist(), strict=True):
        acc_e += e
        acc_o += o
        if acc_e >= min_expected:
            exp_bins.append(acc_e)
            obs_bins.append(acc_o)
            acc_e = acc_o = 0.0
    if exp_bins:
        exp_bins[-1] += acc_e
        obs_bins[-1] += acc_o
    else:
        exp_bins.append(acc_e)
        obs_bins.append(acc_o)
    out_e = outside_p * n
    if out_e >= min_expected or (outside_count > 0 and out_e == 0.0):
        exp_bins.append(max(out_e, 1e-300))
        obs_bins.append(outside_count)
    else:  # merge the rare outside mass into the smallest bin (any partition is valid)
        j = int(np.argmin(exp_bins))
        exp_bins[j] += out_e
        obs_bins[j] += outside_count
    e_arr = np.asarray(exp_bins)
    o_arr = np.asarray(obs_bins)
    statistic = float(np.sum((o_arr - e_arr) ** 2 / e_arr))
    dof = max(len(exp_bins) - 1, 1)
    p_value = float(stats.chi2.sf(statistic, dof))
    return GofResult(statistic, p_value, alpha, dof, len(exp_bins))


def ks_gof(
    samples: Sequence[float] | npt.NDArray[Any],
    cdf: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    *,
    alpha: float = DEFAULT_ALPHA,
) -> GofResult:
    """Kolmogorov-Smirnov test of continuous samples against an exact CDF."""
    result = stats.kstest(np.asarray(samples, dtype=np.float64), cdf)
    return GofResult(float(result.statistic), float(result.pvalue), alpha)


# ---------------------------------------------------------------------------------------
# Clopper-Pearson bounds and the epsilon audit
# ---------------------------------------------------------------------------------------


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound: P[p >= bound] >= 1 - alpha."""
    if k <= 0:
        return 0.0
    return float(stats.beta.ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: P[p <= bound] >= 1 - alpha."""
    if k >= n:
        return 1.0
    return float(stats.beta.isf(alpha, k + 1, n - k))


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval with total miss probability ``alpha``."""
    return clopper_pearson_lower(k, n, alpha / 2), clopper_pearson_upper(k, n, alpha / 2)


@dataclass(frozen=True)
class AuditResult:
    """Outcome of an epsilon-ratio audit.

    Attributes:
        epsilon_lower_bound: A lower bound on the mechanism's true epsilon (at the given
            delta) that is wrong with probability at most ``alpha``; ``-inf`` if no event
            gave any evidence.
        event: The event (and direction) that gave the bound.
        p_lower: Clopper-Pearson lower bound on P[M(D) in S] for that event.
        q_upper: Clopper-Pearson upper bound on P[M(D') in S] for that event.
        alpha: The family-wise false-positive rate.
        n: Samples per side.
    """

    epsilon_lower_bound: float
    event: str
    p_lower: float
    q_upper: float
    alpha: float
    n: int


def epsilon_lower_bound(
    out_d: npt.NDArray[Any] | Sequence[Any],
    out_d2: npt.NDArray[Any] | Sequence[Any],
    events: Mapping[str, Event],
    *,
    delta: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
) -> AuditResult:
    """Certified lower bound on epsilon from outputs on neighbouring inputs D and D'.

    Each event is evaluated in both directions (D against D' and D' against D). With
    m = 2 * len(events) comparisons and two one-sided bounds per comparison, each bound
    is taken at level alpha / (2 m) (Bonferroni), so the returned bound exceeds the
    mechanism's true epsilon with probability at most ``alpha``.

    Args:
        out_d: Independent outputs of M(D) (first axis = repetitions).
        out_d2: Independent outputs of M(D'), same length.
        events: Named predicates, vectorised over the first axis, fixed in advance.
        delta: The mechanism's claimed delta.
        alpha: Family-wise false-positive rate.
    """
    a = np.asarray(out_d)
    b = np.asarray(out_d2)
    n_a, n_b = a.shape[0], b.shape[0]
    level = alpha / (2 * 2 * len(events))
    best = AuditResult(-math.inf, "", 0.0, 1.0, alpha, min(n_a, n_b))
    for name, event in events.items():
        k_a = int(np.count_nonzero(event(a)))
        k_b = int(np.count_nonzero(event(b)))
        for label, k_p, n_p, k_q, n_q in (
            (f"{name} [D vs D']", k_a, n_a, k_b, n_b),
            (f"{name} [D' vs D]", k_b, n_b, k_a, n_a),
        ):
            p_lo = clopper_pearson_lower(k_p, n_p, level)
            q_hi = clopper_pearson_upper(k_q, n_q, level)
            if p_lo <= delta or q_hi <= 0.0:
                continue
            bound = math.log((p_lo - delta) / q_hi)
            if bound > best.epsilon_lower_bound:
                best = AuditResult(bound, label, p_lo, q_hi, alpha, min(n_a, n_b))
    return best


def run_audit(
    sample_d: Sampler,
    sample_d2: Sampler,
    n: int,
    events: Mapping[str, Event],
    *,
    delta: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
) -> AuditResult:
    """Draw ``n`` outputs on each input with the given samplers, then audit them.

    ``sample_d(n)`` must return ``n`` independent outputs of the mechanism run on D
    (for example ``lambda n: np.array([mech.release(0.0) for _ in range(n)])``).
    """
    return epsilon_lower_bound(sample_d(n), sample_d2(n), events, delta=delta, alpha=alpha)


def threshold_events(thresholds: Sequence[float], *, column: int | None = None) -> dict[str, Event]:
    """Events {x <= t} and {x >= t} for scalar outputs (or one ``column`` of vectors).

    Example:
        >>> ev = threshold_events([0.0])
        >>> sorted(ev)
        ['x<=0.0', 'x>=0.0']
        >>> ev['x<=0.0'](np.array([-1.0, 1.0])).tolist()
        [True, False]
    """

    def pick(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return x if column is None else x[:, column]

    def at_most(t: float) -> Event:
        return lambda x: np.asarray(pick(x) <= t)

    def at_least(t: float) -> Event:
        return lambda x: np.asarray(pick(x) >= t)

    events: dict[str, Event] = {}
    for t in thresholds:
        events[f"x<={t}"] = at_most(t)
        events[f"x>={t}"] = at_least(t)
    return events
