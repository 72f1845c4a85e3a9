"""The exponential mechanism, sampled exactly (no floating-point weights).

Given utilities u_1..u_n of n candidates, each with sensitivity at most ``sensitivity``
(the largest change of any one utility between neighbouring datasets), the mechanism
selects index i with probability proportional to exp(epsilon u_i / (2 sensitivity)),
which is epsilon-DP (McSherry and Talwar 2007, Thm 6; Dwork and Roth 2014, Thm 3.10).
When every utility moves in the same direction between neighbours (``monotonic=True``,
e.g. counts under add/remove), the factor 2 can be dropped: exp(epsilon u_i /
sensitivity) is epsilon-DP (Dwork and Roth 2014, remark after Thm 3.10; McSherry and
Talwar 2007). Either way it is one mechanism with fixed parameters, and
epsilon-*bounded range* (the privacy losses of any two outputs differ by at most
epsilon; Durfee and Rogers 2019): its charge is a `BoundedRangeCharge`, whose cost is
``PrivacyCost(epsilon)`` but which the PLD and RDP engines compose through the
bounded-range pairs (Dong, Durfee and Rogers 2020), far tighter than generic epsilon-DP.

Sampling. Float weights (or the Gumbel-max trick with float noise) only approximate
this distribution. Here the utilities are taken at their exact (binary) values, and the
index is drawn by rejection: pick i uniformly, accept with probability
exp(-c (u_max - u_i)) (c = epsilon / (2 sensitivity), or epsilon / sensitivity when
monotonic), an exact Bernoulli(exp(-gamma)) draw (Canonne, Kamath and Steinke 2020,
Algorithm 1). The accepted index has *exactly* the probability proportional to
exp(c u_i); the expected number of rounds is n / sum_i exp(-c (u_max - u_i)) <= n.
`ExponentialMechanism.probabilities()` gives the same distribution in floating
point, computed in log space (log-sum-exp), for inspection and tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from scipy import special

from dpaccount._numeric import check_positive, to_fraction
from dpaccount.charges import BoundedRangeCharge
from dpaccount.errors import InvalidCostError, unreleasable
from dpaccount.mechanisms._sampling import RandomSource, resolve_rng, sample_bernoulli_exp
from dpaccount.mechanisms.base import Mechanism

__all__ = ["ExponentialMechanism"]

T = TypeVar("T")


def _fast_fraction(value: Any) -> Fraction:
    # Plain ints and finite floats convert directly; everything else goes through the
    # house converter (which refuses bools, NaN, infinities and non-numbers).
    kind = type(value)
    if kind is int:
        return Fraction(value)
    if kind is float and math.isfinite(value):
        return Fraction(value)
    return to_fraction(value, "utilities")


def _utility_list(utilities: Any) -> list[Fraction] | None:
    """The utilities as exact Fractions, or None if they are not a 1-D list of finite
    reals; never raises, so no message holding a utility becomes an error's context."""
    try:
        if np.ndim(utilities) != 1:
            return None
        return [_fast_fraction(u) for u in utilities]
    except Exception:  # hostile elements may raise anything, with the value inside
        return None


class ExponentialMechanism(Mechanism):
    """Select one of finitely many candidates with probability ∝ exp(epsilon u / (2 Δ)).

    Theorem: McSherry and Talwar 2007, Thm 6; Dwork and Roth 2014, Thm 3.10
    (epsilon-DP); with ``monotonic=True`` the weight exp(epsilon u / Δ) (Dwork and Roth
    2014, remark after Thm 3.10). Sampled exactly; see the module docstring.

    Args:
        epsilon: > 0.
        sensitivity: Utility sensitivity Δ > 0: max over candidates and neighbouring
            datasets of |u(D, r) - u(D', r)|.
        monotonic: True only if, between any two neighbours, all utilities move in the
            same direction (never some up and some down).
        rng: ``None`` for the OS CSPRNG; ``RandomSource.seeded(...)`` in tests only.

    Examples:
        >>> from dpaccount.mechanisms._sampling import RandomSource
        >>> m = ExponentialMechanism(1, 1, rng=RandomSource.seeded(0))
        >>> m.charge
        BoundedRangeCharge(epsilon=Fraction(1, 1))
        >>> m.charge.cost
        PrivacyCost(epsilon=1, delta=0)
        >>> m.release([0.0, 10.0, 0.0]) in (0, 1, 2)
        True
        >>> [round(float(p), 4) for p in m.probabilities([0.0, 2.0])]   # e^0 : e^1
        [0.2689, 0.7311]
        >>> m.select(["a", "b"], {"a": 0.0, "b": 50.0}.get)
        'b'
    """

    def __init__(
        self,
        epsilon: Any,
        sensitivity: Any,
        *,
        monotonic: bool = False,
        rng: Any = None,
    ) -> None:
        self._epsilon = check_positive(epsilon, "epsilon")
        self._sensitivity = check_positive(sensitivity, "sensitivity")
        if not isinstance(monotonic, bool):
            raise InvalidCostError("monotonic", monotonic, "must be True or False")
        self._monotonic = monotonic
        factor = 1 if monotonic else 2
        self._coefficient = self._epsilon / (factor * self._sensitivity)
        self._rng: RandomSource = resolve_rng(rng)
        self._charge = BoundedRangeCharge(self._epsilon)

    @property
    def charge(self) -> BoundedRangeCharge:
        """``BoundedRangeCharge(epsilon)``: epsilon-DP, and epsilon-bounded range.

        With weights exp(c u), c = epsilon / (2 Δ), the log-ratio of an output's
        probabilities between neighbours is c (u(x, y) - u(x', y)) minus a constant, and
        u(x, y) - u(x', y) lies in [-Δ, Δ], so two outputs' losses differ by at most
        2 c Δ = epsilon; with ``monotonic`` (c = epsilon / Δ) the differences all have one
        sign and lie in an interval of length Δ, so again at most epsilon (Durfee and
        Rogers 2019).
        """
        return self._charge

    @property
    def epsilon(self) -> Fraction:
        """The epsilon of one selection."""
        return self._epsilon

    @property
    def sensitivity(self) -> Fraction:
        """The utility sensitivity Δ."""
        return self._sensitivity

    @property
    def monotonic(self) -> bool:
        """Whether the monotone-utility weight exp(epsilon u / Δ) is used."""
        return self._monotonic

    @property
    def coefficient(self) -> Fraction:
        """c in the weight exp(c u): epsilon / (2 Δ), or epsilon / Δ when monotonic."""
        return self._coefficient

    def _utilities(self, utilities: Any) -> list[Fraction]:
        expected = "a 1-D sequence of finite real utilities, one per candidate"
        values = None if isinstance(utilities, str | bytes) else _utility_list(utilities)
        if values is None:
            raise unreleasable(utilities, expected)
        if not values:
            raise unreleasable(utilities, expected, "At least one candidate is needed.")
        return values

    def release(self, value: Any) -> int:
        """Select an index of ``value`` (the candidates' utilities), exactly.

        Args:
            value: A 1-D sequence of finite real utilities, one per candidate.

        Returns:
            The selected index.

        Raises:
            InvalidCostError: NaN/infinite/non-numeric utilities, or an empty sequence.
        """
        utilities = self._utilities(value)
        top = max(utilities)
        n = len(utilities)
        rng = self._rng
        coef = self._coefficient
        while True:
            i = rng.randbelow(n)
            if sample_bernoulli_exp(coef * (top - utilities[i]), rng):
                return i

    def select(self, candidates: Sequence[T], utility_fn: Callable[[T], Any]) -> T:
        """Score each candidate with ``utility_fn`` and return the selected candidate."""
        items = list(candidates)
        return items[self.release([utility_fn(c) for c in items])]

    def probabilities(self, utilities: Any) -> npt.NDArray[np.float64]:
        """The selection probabilities in floating point, via log-sum-exp (for display).

        The sampler itself does not use these floats.
        """
        values = self._utilities(utilities)
        logits = np.asarray([float(self._coefficient * u) for u in values], dtype=np.float64)
        return np.exp(logits - special.logsumexp(logits))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return (
            f"ExponentialMechanism(epsilon={float(self._epsilon)!r}, "
            f"sensitivity={float(self._sensitivity)!r}, monotonic={self._monotonic})"
        )
