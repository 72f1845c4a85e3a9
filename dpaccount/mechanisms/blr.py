"""The BLR mechanism: a small synthetic dataset for a class of counting queries.

Blum, Ligett and Roth 2008/2013, "A learning theory approach to non-interactive database
privacy" (JACM 60(2)); Dwork and Roth 2014, Sec. 4.1 ("SmallDB"). Over a finite domain
X and k counting queries q_i(D) = #{x in D : pred_i(x)}, the mechanism releases a
multiset D^ of m domain elements chosen by the exponential mechanism with utility

    u(D, D^) = -max_i | q_i(D) - (n / m) q_i(D^) |

where n is the *declared* (public) dataset size used to scale the synthetic counts.
One record changes each q_i(D) by at most 1 (add/remove or substitution) and does not
touch n / m, so u has sensitivity 1 under both relations and selecting D^ with
probability ∝ exp(epsilon u / 2) is epsilon-DP (McSherry and Talwar 2007, Thm 6; Dwork
and Roth 2014, Thm 3.10, applied as in their Sec. 4.1, SmallDB). It is one mechanism
with fixed parameters (non-interactive: the whole query class is answered by one
release). The
utilities are exact rationals and the selection is sampled exactly by
`ExponentialMechanism`.

**Only small domains.** The candidates are all C(|X| + m - 1, m) multisets. That count is
computed first (one integer binomial, microseconds) and the mechanism refuses, with a
`ConfigError`, any configuration above ``max_candidates``
before enumerating anything: it is a configuration that cannot run, not an invalid cost.

Accuracy (Dwork and Roth 2014, Thm 3.11): with probability >= 1 - beta, the released
D^'s largest error is at most the best candidate's plus (2 / epsilon)(ln C + ln(1/beta)).

Examples:
    >>> from dpaccount.mechanisms._sampling import RandomSource
    >>> domain = list(range(8))
    >>> queries = [lambda x, t=t: x < t for t in (2, 4, 6)] + [lambda x: x % 2 == 0,
    ...            lambda x: x in (1, 5)]
    >>> m = BLRMechanism(1, domain, queries, size=6, dataset_size=100,
    ...                  rng=RandomSource.seeded(0))
    >>> m.candidate_count            # C(8 + 6 - 1, 6)
    1716
    >>> synthetic = m.release([0, 1, 2, 3, 4, 5, 6, 7] * 12 + [0, 0, 0, 0])
    >>> len(synthetic)
    6
    >>> BLRMechanism(1, range(1000), queries[:1], size=50, dataset_size=100)
    Traceback (most recent call last):
    ...
    dpaccount.errors.ConfigError: BLR over 1000 domain elements with m = 50 has ...
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_count, check_positive
from dpaccount.costs import PrivacyCost
from dpaccount.errors import ConfigError, InvalidCostError
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.exponential import ExponentialMechanism

__all__ = ["DEFAULT_MAX_CANDIDATES", "BLRMechanism", "candidate_count"]

#: The default ceiling on C(|X| + m - 1, m); enumeration above it is refused.
DEFAULT_MAX_CANDIDATES = 200_000


def candidate_count(domain_size: int, size: int, limit: int | None = None) -> int:
    """The number of multisets of ``size`` elements over ``domain_size`` elements.

    C(|X| + m - 1, m), built as C(big + i, i) for i = 1..min(m, |X| - 1) (each step an
    exact integer); with ``limit``, the loop stops at the first value above it and
    returns that value, so a huge configuration is refused in microseconds.

    Examples:
        >>> candidate_count(8, 5)        # C(12, 5)
        792
        >>> candidate_count(10**9, 10**9, limit=1000) > 1000
        True
    """
    small = min(size, domain_size - 1)
    big = max(size, domain_size - 1)
    value = 1
    for i in range(1, small + 1):
        value = value * (big + i) // i
        if limit is not None and value > limit:
            return value
    return value


def _domain_size(domain: Any) -> int:
    """len(domain), also for ranges beyond the machine size (len() raises there)."""
    try:
        return len(domain)
    except OverflowError:
        if isinstance(domain, range):
            return (domain.stop - domain.start + domain.step - (1 if domain.step > 0 else -1)
                    ) // domain.step
        raise ConfigError("domain is too large to enumerate") from None
    except TypeError:
        raise ConfigError("domain must be a finite sequence of elements") from None


class BLRMechanism(Mechanism):
    """Release a synthetic multiset of ``size`` domain elements (Blum, Ligett, Roth).

    Theorem: Dwork and Roth 2014, Sec. 4.1 (SmallDB / BLR), via the exponential
    mechanism (McSherry and Talwar 2007, Thm 6); see the module docstring for the
    utility and its sensitivity under both relations. epsilon-DP for one release.

    Args:
        epsilon: > 0.
        domain: The finite domain X: distinct, hashable elements.
        queries: k >= 1 counting queries, as predicates on a domain element or as a
            k x |X| 0/1 matrix.
        size: m >= 1, the size of the synthetic dataset.
        dataset_size: The declared (public) n used to scale synthetic counts.
        max_candidates: Refuse configurations with more multisets than this.
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Raises:
        ConfigError: Too many candidates to enumerate (checked first), or a bad domain.
        InvalidCostError: An invalid epsilon, size or query.
    """

    def __init__(
        self,
        epsilon: Any,
        domain: Sequence[Any] | range,
        queries: Sequence[Callable[[Any], Any]] | npt.ArrayLike,
        *,
        size: int,
        dataset_size: int,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        rng: Any = None,
    ) -> None:
        eps = check_positive(epsilon, "epsilon")
        m = check_count(size, "size")
        n = check_count(dataset_size, "dataset_size")
        limit = check_count(max_candidates, "max_candidates")
        domain_size = _domain_size(domain)
        if domain_size < 1:
            raise ConfigError("domain must hold at least one element")
        total = candidate_count(domain_size, m, limit)
        if total > limit:
            raise ConfigError(
                f"BLR over {domain_size} domain elements with m = {m} has "
                f"C({domain_size + m - 1}, {m}) > {limit} candidate datasets (the limit); "
                "use a smaller domain or m (or raise max_candidates)"
            )
        self._domain = list(domain)
        try:
            self._index = {x: i for i, x in enumerate(self._domain)}
        except TypeError:
            raise ConfigError("domain elements must be hashable") from None
        if len(self._index) != domain_size:
            raise ConfigError("domain elements must be distinct")
        self._q = self._query_matrix(queries)
        self._m, self._n, self._count = m, n, total
        self._epsilon = eps
        self._exp = ExponentialMechanism(eps, 1, rng=rng)
        self._hists: npt.NDArray[np.int64] | None = None
        self._charge = PrivacyCost(eps)

    def _query_matrix(self, queries: Any) -> npt.NDArray[np.int64]:
        d = len(self._domain)
        if isinstance(queries, np.ndarray) or (
            isinstance(queries, Sequence) and queries and not callable(queries[0])
        ):
            q = np.asarray(queries)
            if q.ndim != 2 or q.shape[1] != d or not np.isin(q, (0, 1)).all():
                raise InvalidCostError("queries", queries, f"must be a k x {d} 0/1 matrix")
            return q.astype(np.int64)
        rows = []
        for fn in queries:
            if not callable(fn):
                raise InvalidCostError("queries", fn, "must be a predicate on domain elements")
            rows.append([1 if fn(x) else 0 for x in self._domain])
        if not rows:
            raise InvalidCostError("queries", queries, "at least one query is needed")
        return np.asarray(rows, dtype=np.int64)

    def _candidates(self) -> npt.NDArray[np.int64]:
        """All multisets as count vectors (C x |X|), built once, lazily."""
        if self._hists is None:
            d, m = len(self._domain), self._m
            combos = np.fromiter(
                itertools.chain.from_iterable(
                    itertools.combinations_with_replacement(range(d), m)
                ),
                dtype=np.int64,
                count=self._count * m,
            ).reshape(self._count, m)
            hists = np.zeros((self._count, d), dtype=np.int64)
            rows = np.repeat(np.arange(self._count), m)
            np.add.at(hists, (rows, combos.ravel()), 1)
            self._hists = hists
        return self._hists

    @property
    def charge(self) -> PrivacyCost:
        """``PrivacyCost(epsilon)``."""
        return self._charge

    @property
    def candidate_count(self) -> int:
        """C(|X| + m - 1, m): the number of candidate synthetic datasets."""
        return self._count

    @property
    def query_matrix(self) -> npt.NDArray[np.int64]:
        """The k x |X| 0/1 matrix of the queries on the domain."""
        return self._q.copy()

    def histogram(self, data: Any) -> npt.NDArray[np.int64]:
        """Counts of each domain element in ``data`` (elements outside X are dropped)."""
        hist = np.zeros(len(self._domain), dtype=np.int64)
        values = data.tolist() if hasattr(data, "tolist") else list(data)
        for x in values:
            try:
                i = self._index.get(x)
            except TypeError:
                i = None
            if i is not None:
                hist[i] += 1
        return hist

    def utilities(self, data: Any) -> list[Fraction]:
        """u(D, D^) for every candidate, exactly: -max_i |m q_i(D) - n q_i(D^)| / m."""
        true_counts = self._q @ self.histogram(data)
        synth = self._candidates() @ self._q.T  # C x k
        scaled = np.abs(self._m * true_counts[None, :] - self._n * synth).max(axis=1)
        return [Fraction(-int(v), self._m) for v in scaled.tolist()]

    def release(self, value: Any) -> tuple[Any, ...]:
        """Select a synthetic dataset for the records ``value`` (a sequence of elements).

        Returns:
            The synthetic multiset as a tuple of ``size`` domain elements.
        """
        chosen = self._candidates()[self._exp.release(self.utilities(value))]
        return tuple(
            x for x, c in zip(self._domain, chosen.tolist(), strict=True) for _ in range(c)
        )

    def answers(self, synthetic: Sequence[Any]) -> npt.NDArray[np.float64]:
        """The k query answers a synthetic dataset gives, scaled to n: (n / m) q_i(D^)."""
        counts = (self._q @ self.histogram(synthetic)).astype(np.float64)
        return counts * (self._n / self._m)

    def error_bound(self, beta: Any) -> float:
        """(2 / epsilon)(ln C + ln(1 / beta)): the excess error over the best candidate
        that is exceeded with probability at most ``beta`` (Dwork and Roth 2014, Thm 3.11).
        """
        b = check_positive(beta, "beta")
        if b >= 1:
            raise InvalidCostError("beta", beta, "must be in (0, 1)")
        return float(2 / self._epsilon) * (math.log(self._count) - math.log(float(b)))

    def __repr__(self) -> str:
        return (
            f"BLRMechanism(epsilon={float(self._epsilon)!r}, domain_size={len(self._domain)}, "
            f"queries={self._q.shape[0]}, size={self._m}, candidates={self._count})"
        )
