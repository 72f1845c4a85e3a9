"""What the aggregates return: a noisy value with its record and an accuracy statement."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from dpaccount.charges import Relation
from dpaccount.costs import PrivacyCost

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.accountant import ChargePreview
    from dpaccount.records import LedgerRecord

__all__ = ["AggregatePreview", "AggregateResult"]


@attrs.frozen
class AggregateResult:
    """A noisy aggregate with its ledger record and an accuracy statement.

    Attributes:
        value: The noisy answer (a float; a float array for a histogram; the selected
            candidate for a quantile).
        interval: ``(low, high)`` that contains the implemented true answer (clipped,
            rounded to the lattice) with probability at least ``level``; per bin for a
            histogram; ``None`` for a quantile (see ``error_bound``).
        level: The confidence level of ``interval`` / ``error_bound``.
        error_bound: The half-width of the noise at ``level`` in the answer's units
            (per bin for a histogram; in ranks for a quantile).
        accuracy: The accuracy statement in words.
        record: The ledger record of the charge.
        sensitivity: The sensitivity used, in the answer's units (for a mean: of the
            centred sum).
        relation: The neighbouring relation the sensitivity holds for.
        granularity: The lattice spacing g the values were rounded to (or ``None``).
    """

    value: Any
    interval: tuple[Any, Any] | None
    level: float
    error_bound: Any
    accuracy: str
    record: LedgerRecord
    sensitivity: Fraction
    relation: Relation
    granularity: Fraction | None = None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) charged for this aggregate."""
        return self.record.cost

    def clamped(self, lower: float = 0.0, upper: float | None = None) -> AggregateResult:
        """The same result with its value and interval clipped to ``[lower, upper]``.

        Post-processing of a released value: free (no new charge, the same record) and
        still covered by the charge's guarantee. A noisy count below 0 becomes 0; the
        interval still contains the true answer whenever the true answer is in the
        range (a count is never negative).

        Examples:
            >>> from dpaccount import Accountant
            >>> from dpaccount.aggregates import count
            >>> res = count([], Accountant(1), 1).clamped()
            >>> res.value >= 0 and res.interval[0] >= 0
            True
        """
        def clip(x: Any) -> Any:
            arr = np.clip(np.asarray(x, dtype=np.float64), lower, upper)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            clip(self.interval[0]), clip(self.interval[1])
        )
        return attrs.evolve(self, value=clip(self.value), interval=interval)

    def rounded(self) -> AggregateResult:
        """The same result with its value rounded to whole numbers (free post-processing,
        e.g. for counts); the interval is widened outward to whole numbers."""
        def nearest(x: Any) -> Any:
            arr = np.rint(np.asarray(x, dtype=np.float64))
            return float(arr) if arr.ndim == 0 else arr

        def outward(x: Any, up: bool) -> Any:
            arr = np.ceil(x) if up else np.floor(x)
            arr = np.asarray(arr, dtype=np.float64)
            return float(arr) if arr.ndim == 0 else arr

        interval = None if self.interval is None else (
            outward(self.interval[0], False), outward(self.interval[1], True)
        )
        return attrs.evolve(self, value=nearest(self.value), interval=interval)


@attrs.frozen
class AggregatePreview:
    """What an aggregate would charge and how accurate it would be (`preview`).

    Nothing was charged and no data was read.

    Attributes:
        charge: What the ledger would do (`ChargePreview`: the cost, whether it would
            be admitted, the totals before and after).
        level: The confidence level of ``error_bound``.
        error_bound: The half-width of the noise at ``level``, in the answer's units:
            the same number the aggregate reports when it runs (for a histogram, per
            bin; per group for a group-by; ``None`` for a group-by mean, whose interval
            depends on its noisy count).
    """

    charge: ChargePreview
    level: float
    error_bound: float | None

    @property
    def cost(self) -> PrivacyCost:
        """The (epsilon, delta) the aggregate would charge."""
        return self.charge.cost

    @property
    def admitted(self) -> bool:
        """Whether the ledger would take the charge now."""
        return self.charge.admitted
