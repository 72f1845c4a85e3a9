"""The one error tree of dpaccount.

Every error the library raises on purpose is a `DPAccountError`; where the
meaning of a builtin holds, the error also subclasses it, so ``except ValueError`` keeps
working for invalid input::

    DPAccountError(Exception)
    ├── InvalidCostError(DPAccountError, ValueError)   NaN/inf/negative ε, δ ∉ [0, 1),
    │                                                  bad rate, bool or str where a number is due
    ├── BudgetExceededError(DPAccountError)            .requested .spent .budget
    │   └── StepRefusedError                           a training step; .step, and whether
    │                                                  its noisy gradient was computed
    ├── UnsupportedChargeError(DPAccountError)         a rule or relation cannot compose a charge
    ├── DuplicateQueryError(DPAccountError)            a query_id was already charged; .record
    ├── UnreleasableResultError(DPAccountError, ValueError)  a query's answer cannot be released
    │                                                  (names its type/shape/dtype, never its value)
    ├── ConfigError(DPAccountError, ValueError)        invalid configuration (wraps pydantic)
    └── StorageError(DPAccountError)
        ├── LedgerConflictError                        a concurrent writer won; retryable
        ├── LedgerCorruptError                         a record fails validation or the chain breaks
        └── ReadOnlyLedgerError                        a charge to a ledger opened read-only

Warnings: `DeltaWarning` (a ``UserWarning``) when a budget's delta reaches 1/n for
a declared dataset size n.

A missing optional extra raises `ImportError` naming the
``pip install "dpaccount[...]"`` command that provides it (see `missing_extra()`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from dpaccount.costs import Budget, PrivacyCost

__all__ = [
    "BudgetExceededError",
    "ConfigError",
    "DPAccountError",
    "DeltaWarning",
    "DuplicateQueryError",
    "InvalidCostError",
    "LedgerConflictError",
    "LedgerCorruptError",
    "ReadOnlyLedgerError",
    "StepRefusedError",
    "StorageError",
    "UnreleasableResultError",
    "UnsupportedChargeError",
    "describe_secret",
    "missing_extra",
    "unreleasable",
]


class DPAccountError(Exception):
    """Base class of every error dpaccount raises on purpose."""


class InvalidCostError(DPAccountError, ValueError):
    """A privacy parameter is not a valid number for its field.

    Raised for NaN, infinities, negative values, ``delta >= 1``, booleans, non-numeric
    strings and other values that cannot be a privacy parameter. The message names the
    field and repeats the value that was given.

    Attributes:
        field: The name of the offending parameter (e.g. ``"epsilon"``).
        value: The value that was rejected, as given.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={_short_repr(value)}: {reason}")


def _short_repr(value: Any) -> str:
    """repr(value), at most 80 characters; never raises (huge ints, hostile reprs)."""
    try:
        text = repr(value)
    except Exception:  # a huge int, or a hostile __repr__
        bits = value.bit_length() if isinstance(value, int) else None
        return f"<{type(value).__name__} of {bits} bits>" if bits else f"<{type(value).__name__}>"
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"


class BudgetExceededError(DPAccountError):
    """A charge would take the ledger over its budget; nothing was recorded or run.

    Attributes:
        requested: The composed cost of the refused charge on its own.
        spent: The composed total spent before the refused charge.
        budget: The ledger's budget.
        would_be: The composed total the ledger would have reached (None when its delta
            would reach 1, which no cost can describe).
        rule: The name of the composition rule that made the decision.
        ledger: The ledger that refused, when one charge went to several (a sub-budget
            and its parents, a window of blocks); None otherwise.
    """

    def __init__(
        self,
        requested: PrivacyCost,
        spent: PrivacyCost,
        budget: Budget,
        would_be: PrivacyCost | None,
        rule: str,
        reason: str | None = None,
        ledger: str | None = None,
    ) -> None:
        self.requested = requested
        self.spent = spent
        self.budget = budget
        self.would_be = would_be
        self.rule = rule
        self.ledger = ledger
        limit = reason or f"over the budget {budget}"
        total = "would have a delta of 1 or more" if would_be is None else f"would be {would_be}"
        by = "" if ledger is None else f" by ledger {ledger!r}"
        super().__init__(
            f"refused{by}: this charge costs {requested}; {spent} is already spent, and "
            f"under the {rule!r} rule the total {total}, {limit}. Nothing "
            "was recorded and the query did not run; ask for less (a smaller epsilon or "
            "delta, or fewer repetitions) or use a new budget."
        )


class StepRefusedError(BudgetExceededError):
    """A training step (or a chunk of steps) would take the run over its budget.

    Nothing was recorded. The message says what happened to the step: when the refusal
    comes from an optimizer hook (Opacus), the step's noisy gradient was already
    computed but is discarded, not applied, so the model is as it was after the last
    admitted step; when it comes before a chunk of steps (JAX), nothing ran at all.

    Attributes:
        step: The number of steps admitted before this one (the refused step is
            ``step + 1``).
        steps: How many steps were asked for at once.
        computed: Whether the refused step's gradient had been computed.
    """

    def __init__(self, refused: BudgetExceededError, *, step: int, steps: int,
                 computed: bool) -> None:
        self.step = step
        self.steps = steps
        self.computed = computed
        self.requested = refused.requested
        self.spent = refused.spent
        self.budget = refused.budget
        self.would_be = refused.would_be
        self.rule = refused.rule
        what = (
            "The step's noisy gradient was computed but is discarded, not applied: the "
            "model is as it was after the last admitted step."
            if computed
            else "Nothing ran."
        )
        count = f"steps {step + 1}-{step + steps}" if steps > 1 else f"step {step + 1}"
        total = "a delta of 1 or more" if self.would_be is None else str(self.would_be)
        DPAccountError.__init__(
            self,
            f"refused: training {count} would take the run to {total} under the "
            f"{self.rule!r} rule, over its budget {self.budget}. Nothing was recorded; "
            f"{step} steps were admitted before. {what} Stop training here (save the "
            "model), or continue with more noise or a new budget.",
        )


class UnsupportedChargeError(DPAccountError):
    """A rule, relation or sampling scheme cannot compose this charge.

    The message names the part of the charge that is not supported and why (for
    example a fixed-plan rule asked to take a charge outside its declared plan).
    """


class DuplicateQueryError(DPAccountError):
    """A charge carried a ``query_id`` that the ledger already holds.

    Retrying a query with the same id never charges twice, and it must not run the query
    again either (fresh noise for free would leak more). The original record is kept
    in `record`. The ledger keeps charges, never answers: a job that may be retried
    stores its answer itself (or uses a new query id for a new query).

    Attributes:
        query_id: The repeated id.
        record: The record of the first charge with that id.
    """

    def __init__(self, query_id: str, record: Any) -> None:
        self.query_id = query_id
        self.record = record
        when = getattr(record, "timestamp", None)
        at = "" if when is None else f", {when:%Y-%m-%d %H:%M:%S} UTC"
        super().__init__(
            f"query_id {query_id!r} was already charged (record {record.seq}{at}); nothing "
            "was charged again, and the query must not run again (fresh noise would leak "
            "more). The ledger keeps the charge (its label, cost and time), not the "
            "answer: reuse the answer your job stored from that run, or give a new "
            "query_id to run a new query (charged anew)."
        )


def describe_secret(value: Any) -> str:
    """Name what a possibly secret value *is*, never what it holds.

    Used wherever an un-noised value (a query's answer, a data row) would otherwise end
    up in an error, a warning, a repr or a log: only the type's qualified name and, for
    arrays and frames, the shape and dtype are given.

    Examples:
        >>> describe_secret(42)
        'int'
        >>> import numpy as np
        >>> describe_secret(np.zeros((2, 3)))
        'numpy.ndarray of shape (2, 3), dtype float64'
        >>> describe_secret([1, 2, 3])
        'list of length 3'
    """
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", "__main__") else (
        f"{module.split('.')[0]}.{kind.__qualname__}"
    )
    parts = [name]
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        parts.append(f"of shape {shape}")
    elif isinstance(value, (list, tuple, dict, set, frozenset, str, bytes)):
        parts.append(f"of length {len(value)}")
    dtype = getattr(value, "dtype", None)
    if dtype is not None and isinstance(getattr(dtype, "name", None), str):
        parts.append(f"dtype {dtype.name}")
    text = " ".join(parts[:2])
    return f"{text}, {parts[2]}" if len(parts) > 2 else text


class UnreleasableResultError(DPAccountError, ValueError):
    """A query returned something its mechanism cannot release.

    Raised after the query ran (so its charge is kept: no refunds). The message and the
    attributes describe the answer only by its type, shape and dtype (see
    `describe_secret()`); the answer itself is never kept on the error, its
    arguments, its ``__cause__`` or its ``__context__``.

    Attributes:
        found: What the answer was, e.g. ``"list of length 5"``.
        expected: What the mechanism can release, e.g. ``"a finite real number"``.
    """

    def __init__(self, found: str, expected: str, hint: str = "") -> None:
        self.found = found
        self.expected = expected
        message = f"the query returned {found}; the mechanism releases {expected}"
        super().__init__(f"{message}. {hint}" if hint else message + ".")


def unreleasable(value: Any, expected: str, hint: str = "") -> UnreleasableResultError:
    """Build the error for an answer its mechanism cannot release, naming only its type.

    Raise it *outside* any ``except`` block that handled an error about the value, so that
    no exception holding the value becomes its ``__context__``.

    Examples:
        >>> str(unreleasable([31337.5], "a finite real number"))
        'the query returned list of length 1; the mechanism releases a finite real number.'
    """
    return UnreleasableResultError(describe_secret(value), expected, hint)


class ConfigError(DPAccountError, ValueError):
    """Invalid configuration: an unknown rule, an unknown URL scheme, a bad plan."""


class StorageError(DPAccountError):
    """The ledger's store failed; the query was refused (the store fails closed)."""


class LedgerConflictError(StorageError):
    """A concurrent writer appended first; the caller may reload and retry."""


class ReadOnlyLedgerError(StorageError):
    """A charge (or another write) to a ledger opened read-only; nothing was written."""


class LedgerCorruptError(StorageError):
    """A stored record fails validation or the hash chain is broken.

    Attributes:
        seq: The sequence number of the first bad record, if known.
    """

    def __init__(self, message: str, seq: int | None = None) -> None:
        self.seq = seq
        super().__init__(message)


class DeltaWarning(UserWarning):
    """A ledger's delta is large for its declared dataset size.

    With n records, a mechanism that publishes one random record in full with
    probability delta is (0, delta)-DP; at delta = 1/n it publishes a record on average.
    The accountant warns when a budget's delta admits that, and refuses charges that
    would take the total delta to 1/n or more.
    """


def missing_extra(module: str, extra: str) -> ImportError:
    """Build the `ImportError` for an optional dependency that is not installed.

    Args:
        module: The module that failed to import (e.g. ``"psycopg"``).
        extra: The dpaccount extra that provides it (e.g. ``"postgres"``).

    Returns:
        An ImportError whose message holds the exact install command.

    Examples:
        >>> str(missing_extra("matplotlib", "plot"))
        'matplotlib is not installed; install it with: pip install "dpaccount[plot]"'
    """
    return ImportError(
        f'{module} is not installed; install it with: pip install "dpaccount[{extra}]"'
    )
