"""Ledger records and ledger metadata, and their closed-world serialised form.

A `LedgerRecord` is one accepted charge. In memory it is an attrs value holding
the charge object itself; on disk it is the pydantic `RecordModel`, a
discriminated union on ``kind`` with a ``schema_version``. Decoding never imports code
named by stored data: only the charge kinds listed in `dpaccount.records.models` can be
read back. Exact numbers are stored as ``"numerator/denominator"`` strings.

`LedgerMeta` (what a ledger is) is an attrs value too; its stored JSON is written and
read by the pydantic `MetaModel`. pydantic and the models are imported the first time
something is (de)serialised (`dpaccount.records.models`): an in-memory accountant never
pays for them.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

import attrs

from dpaccount.charges import Charge, Relation
from dpaccount.costs import Budget
from dpaccount.keys import LedgerKey, link
from dpaccount.records.values import (
    GENESIS_HASH,
    MAX_NAME_LENGTH,
    SCHEMA_VERSION,
    LedgerRecord,
    check_ledger_name,
    stored_name,
)

if TYPE_CHECKING:
    from dpaccount.records.models import ChargeModel, RecordModel

__all__ = [
    "GENESIS_HASH",
    "MAX_NAME_LENGTH",
    "SCHEMA_VERSION",
    "LedgerMeta",
    "LedgerRecord",
    "RecordModel",
    "canonical_bytes",
    "chain_hash",
    "chain_hash_payload",
    "check_ledger_name",
    "decode_charge",
    "decode_record",
    "encode_charge",
    "encode_record",
    "stored_name",
]

#: The serialised forms, found in `dpaccount.records.models` when first asked for.
_MODELS: Final = frozenset({
    "RecordModel", "ChargeModel", "CostModel", "MetaModel", "LaplaceModel",
    "GaussianModel", "DiscreteLaplaceModel", "DiscreteGaussianModel",
    "RandomizedResponseModel", "BoundedRangeModel", "SubsampledModel", "ParallelModel",
    "RepeatedModel",
})


def __getattr__(name: str) -> Any:
    # PEP 562: the pydantic models load on first use (``from dpaccount.records import
    # RecordModel`` keeps working)
    if name in _MODELS:
        from dpaccount.records import models

        return getattr(models, name)
    raise AttributeError(f"module 'dpaccount.records' has no attribute {name!r}")


def _frac(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def _unfrac(text: str) -> Fraction:
    num, _, den = text.partition("/")
    return Fraction(int(num), int(den or "1"))


def _relation(value: Relation | str) -> Relation:
    return Relation(value)


@attrs.frozen(kw_only=True)
class LedgerMeta:
    """What a ledger is: stored once with it and compared on every open.

    An attrs value in memory; its stored JSON (`model_dump_json`, read back by
    `model_validate_json`) is written by the pydantic `MetaModel`, byte for byte as when
    this class was that model. Build one with `build`, which checks the names.

    Attributes:
        name: The ledger's name (one per dataset).
        budget_epsilon: Exact epsilon budget, or None for tracking only.
        budget_delta: Exact delta budget.
        rule: The rule's ``describe()`` dictionary (its name and parameters).
        relation: The neighbouring relation of every charge.
        schema_version: The record format version.
        dataset_size: The declared number of records n, if any (total delta < 1/n).
        key_id: For a keyed ledger (an HMAC chain), the id of its key (`LedgerKey.key_id`);
            None (and absent from the stored JSON) for a SHA-256 chain. Set by the store.
        parent: For a sub-budget, the ledger (in the same database) whose budget it is a
            share of: every charge to it is also charged to the parent and its parents,
            all or nothing. None (and absent from the stored JSON) otherwise.
        budget_rho: A zCDP budget rho (`Budget.rho`); None (and absent) for none.
    """

    schema_version: int = SCHEMA_VERSION
    name: str
    budget_epsilon: str | None
    budget_delta: str
    rule: dict[str, Any] = attrs.field(converter=dict)
    relation: Relation = attrs.field(converter=_relation)
    dataset_size: int | None = None
    key_id: str | None = None
    parent: str | None = None
    budget_rho: str | None = None

    @property
    def budget(self) -> Budget:
        """The budget as a value."""
        rho = None if self.budget_rho is None else _unfrac(self.budget_rho)
        if self.budget_epsilon is None and rho is None:
            return Budget.unlimited(_unfrac(self.budget_delta))
        eps = {} if self.budget_epsilon is None else {"epsilon": _unfrac(self.budget_epsilon)}
        return Budget(**eps, delta=_unfrac(self.budget_delta), rho=rho)

    @classmethod
    def build(
        cls,
        name: str,
        budget: Budget,
        rule: dict[str, Any],
        relation: Relation | str,
        dataset_size: int | None = None,
        parent: str | None = None,
    ) -> LedgerMeta:
        """Describe a ledger from its values.

        Raises:
            ConfigError: ``name`` or ``parent`` is not a valid ledger name.
        """
        check_ledger_name(name)
        if parent is not None:
            check_ledger_name(parent, "parent")
        return cls(
            name=name,
            budget_epsilon=None if budget.epsilon is None else _frac(budget.epsilon),
            budget_delta=_frac(budget.delta),
            rule=rule,
            relation=relation,
            dataset_size=dataset_size,
            parent=parent,
            budget_rho=None if budget.rho is None else _frac(budget.rho),
        )

    def model_copy(self, *, update: dict[str, Any]) -> LedgerMeta:
        """A copy with the fields in ``update`` replaced (not checked again, as pydantic's
        ``model_copy`` does not)."""
        return attrs.evolve(self, **update)

    def model_dump_json(self) -> str:
        """The stored JSON (compact; the absent key, parent and rho left out)."""
        from dpaccount.records.models import meta_json

        return meta_json(self)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        """The stored JSON as Python values (only ``mode="json"``).

        Raises:
            ValueError: Another mode.
        """
        if mode != "json":
            raise ValueError("LedgerMeta dumps only in mode='json'")
        from dpaccount.records.models import meta_dump

        return meta_dump(self)

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> LedgerMeta:
        """Read stored JSON back, validating every field (names by `check_ledger_name`).

        Raises:
            ValueError: (pydantic's ``ValidationError``) The text is not valid metadata.
        """
        from dpaccount.records.models import meta_fields

        return cls(**meta_fields(text))


def encode_charge(charge: Charge) -> ChargeModel:
    """The serialised form of a charge (`dpaccount.records.models.encode_charge`).

    Raises:
        InvalidCostError: Not a charge, or (changed past its constructors) nested deeper
            than `dpaccount.charges.MAX_NESTING` levels.
    """
    from dpaccount.records import models

    return models.encode_charge(charge)


def decode_charge(model: ChargeModel) -> Charge:
    """Rebuild a charge from its serialised form (`dpaccount.records.models.decode_charge`).

    Raises:
        InvalidCostError: An invalid value, or a tree nested too deep.
    """
    from dpaccount.records import models

    return models.decode_charge(model)


def encode_record(record: LedgerRecord) -> RecordModel:
    """The serialised form of a record."""
    from dpaccount.records import models

    return models.encode_record(record)


def decode_record(data: RecordModel | dict[str, Any] | str | bytes) -> LedgerRecord:
    """Validate and rebuild a record; any defect raises `LedgerCorruptError`."""
    from dpaccount.records import models

    return models.decode_record(data)


def canonical_bytes(record: LedgerRecord) -> bytes:
    """A canonical encoding of a record: sorted keys, no spaces, UTF-8."""
    payload = encode_record(record).model_dump(mode="json")
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def chain_hash(prev_hash: str, record: LedgerRecord, key: LedgerKey | None = None) -> str:
    """The link after ``prev_hash`` of the record's canonical encoding: SHA-256, or
    HMAC-SHA256 under ``key`` for a keyed ledger."""
    return chain_hash_payload(prev_hash, canonical_bytes(record), key)


def chain_hash_payload(prev_hash: str, payload: bytes | str,
                       key: LedgerKey | None = None) -> str:
    """`chain_hash()` of a record from its stored canonical encoding (no re-encoding).

    A payload that is not the canonical encoding of its record gets a different hash,
    so checking stored rows this way detects the same alterations.
    """
    return link(prev_hash, payload.encode() if isinstance(payload, str) else payload, key)
