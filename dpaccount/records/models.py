"""The stored form of records and ledger metadata: pydantic models, a closed world.

A record on disk is `RecordModel`, a discriminated union on ``kind`` with a
``schema_version``; ledger metadata is `MetaModel`. Decoding never imports code named by
stored data: only the charge kinds listed here can be read back. Exact numbers are stored
as ``"numerator/denominator"`` strings.

This module (and pydantic with it) is imported only when something is serialised or read
back (`dpaccount.records` imports it on first use): an in-memory accountant never loads it.
"""

from __future__ import annotations

from datetime import UTC
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import pydantic

from dpaccount.charges import (
    MAX_NESTING,
    BoundedRangeCharge,
    Charge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    check_nesting,
)
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError, LedgerCorruptError
from dpaccount.records.values import SCHEMA_VERSION, LedgerRecord, check_ledger_name

if TYPE_CHECKING:
    from dpaccount.records import LedgerMeta

__all__ = [
    "ChargeModel",
    "CostModel",
    "MetaModel",
    "RecordModel",
    "decode_charge",
    "decode_record",
    "encode_charge",
    "encode_record",
    "meta_dump",
    "meta_fields",
    "meta_json",
]


def _frac(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def _unfrac(text: str) -> Fraction:
    num, _, den = text.partition("/")
    return Fraction(int(num), int(den or "1"))


Exact = Annotated[str, pydantic.Field(pattern=r"^-?\d+(/\d+)?$")]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class CostModel(_Strict):
    """Serialised `PrivacyCost`."""

    kind: Literal["cost"] = "cost"
    epsilon: Exact
    delta: Exact


class LaplaceModel(_Strict):
    """Serialised `LaplaceCharge`."""

    kind: Literal["laplace"] = "laplace"
    scale: Exact
    sensitivity: Exact


class GaussianModel(_Strict):
    """Serialised `GaussianCharge`."""

    kind: Literal["gaussian"] = "gaussian"
    sigma: Exact
    sensitivity: Exact
    epsilon: Exact


class DiscreteLaplaceModel(_Strict):
    """Serialised `DiscreteLaplaceCharge`."""

    kind: Literal["discrete_laplace"] = "discrete_laplace"
    scale: Exact
    sensitivity: Exact
    dimension: int = pydantic.Field(default=1, ge=1)


class DiscreteGaussianModel(_Strict):
    """Serialised `DiscreteGaussianCharge`."""

    kind: Literal["discrete_gaussian"] = "discrete_gaussian"
    sigma: Exact
    sensitivity: Exact
    epsilon: Exact
    delta: Exact
    dimension: int = pydantic.Field(default=1, ge=1)


class RandomizedResponseModel(_Strict):
    """Serialised `RandomizedResponseCharge`."""

    kind: Literal["randomized_response"] = "randomized_response"
    epsilon: Exact
    categories: int = pydantic.Field(ge=2)


class BoundedRangeModel(_Strict):
    """Serialised `BoundedRangeCharge`."""

    kind: Literal["bounded_range"] = "bounded_range"
    epsilon: Exact


class SubsampledModel(_Strict):
    """Serialised `Subsampled`."""

    kind: Literal["subsampled"] = "subsampled"
    charge: ChargeModel
    rate: Exact
    scheme: Scheme


class ParallelModel(_Strict):
    """Serialised `Parallel`."""

    kind: Literal["parallel"] = "parallel"
    partitions: list[ChargeModel]
    relation: Relation


class RepeatedModel(_Strict):
    """Serialised `Repeated`."""

    kind: Literal["repeated"] = "repeated"
    charge: ChargeModel
    count: int


ChargeModel = Annotated[
    CostModel
    | LaplaceModel
    | GaussianModel
    | DiscreteLaplaceModel
    | DiscreteGaussianModel
    | RandomizedResponseModel
    | BoundedRangeModel
    | SubsampledModel
    | ParallelModel
    | RepeatedModel,
    pydantic.Field(discriminator="kind"),
]

for _model in (SubsampledModel, ParallelModel, RepeatedModel):
    _model.model_rebuild()


class RecordModel(_Strict):
    """Serialised `LedgerRecord` with its place in the hash chain."""

    schema_version: Literal[1] = SCHEMA_VERSION
    seq: int = pydantic.Field(ge=0)
    label: str | None
    charge: ChargeModel
    cost: CostModel
    rule: str
    timestamp: pydantic.AwareDatetime  # a naive time would be read in the reader's zone
    query_id: str | None = None



class MetaModel(_Strict):
    """Serialised `dpaccount.records.LedgerMeta`: the same fields with the same meanings
    (see its attributes), validated as they are read back; a key and a parent that are
    None, and a ρ that is None, are absent from the stored JSON."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = pydantic.Field(min_length=1)
    budget_epsilon: Exact | None
    budget_delta: Exact
    rule: dict[str, Any]
    relation: Relation
    dataset_size: int | None = pydantic.Field(default=None, ge=1)
    key_id: str | None = pydantic.Field(default=None, pattern="^[0-9a-f]{16}$")
    parent: str | None = pydantic.Field(default=None, min_length=1)
    budget_rho: Exact | None = None

    @pydantic.field_validator("name", "parent")
    @classmethod
    def _check_name(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        # a stored name that breaks the rule fails validation (`LedgerCorruptError` where
        # it is read back); `build` checks first, with a typed `ConfigError`
        return value if value is None else check_ledger_name(value, str(info.field_name))

    @pydantic.model_serializer(mode="wrap")
    def _omit_absent_options(self, handler: pydantic.SerializerFunctionWrapHandler) -> Any:
        # Metadata without a key or a parent serialises exactly as before they existed.
        data = handler(self)
        if isinstance(data, dict):
            for field in ("key_id", "parent", "budget_rho"):
                if data.get(field) is None:
                    data.pop(field, None)
        return data


#: The fields of `MetaModel`, in their stored order.
_META_FIELDS: Final = tuple(MetaModel.model_fields)


def _meta_model(meta: LedgerMeta) -> MetaModel:
    # built from values that `LedgerMeta` holds (checked where they came in), not
    # validated again: serialising, like pydantic's own, does not re-check
    return MetaModel.model_construct(**{f: getattr(meta, f) for f in _META_FIELDS})


def meta_json(meta: LedgerMeta) -> str:
    """The stored JSON of ledger metadata (the bytes that are hashed and compared)."""
    return _meta_model(meta).model_dump_json()


def meta_dump(meta: LedgerMeta) -> dict[str, Any]:
    """Ledger metadata as JSON-ready values (what `meta_json` writes)."""
    data: dict[str, Any] = _meta_model(meta).model_dump(mode="json")
    return data


def meta_fields(text: str | bytes) -> dict[str, Any]:
    """Validate stored metadata JSON; its fields, for `dpaccount.records.LedgerMeta`.

    Raises:
        pydantic.ValidationError: (a ``ValueError``) The text is not valid metadata.
    """
    model = MetaModel.model_validate_json(text)
    return {f: getattr(model, f) for f in _META_FIELDS}


def encode_charge(charge: Charge) -> ChargeModel:
    """The serialised form of a charge.

    Raises:
        InvalidCostError: Not a charge, or (changed past its constructors) nested deeper
            than `dpaccount.charges.MAX_NESTING` levels.
    """
    check_nesting(charge)
    return _encode(charge)


def _encode(charge: Charge) -> ChargeModel:
    if isinstance(charge, PrivacyCost):
        return CostModel(epsilon=_frac(charge.epsilon), delta=_frac(charge.delta))
    if isinstance(charge, LaplaceCharge):
        return LaplaceModel(scale=_frac(charge.scale), sensitivity=_frac(charge.sensitivity))
    if isinstance(charge, GaussianCharge):
        return GaussianModel(
            sigma=_frac(charge.sigma),
            sensitivity=_frac(charge.sensitivity),
            epsilon=_frac(charge.epsilon),
        )
    if isinstance(charge, DiscreteLaplaceCharge):
        return DiscreteLaplaceModel(
            scale=_frac(charge.scale),
            sensitivity=_frac(charge.sensitivity),
            dimension=charge.dimension,
        )
    if isinstance(charge, DiscreteGaussianCharge):
        return DiscreteGaussianModel(
            sigma=_frac(charge.sigma),
            sensitivity=_frac(charge.sensitivity),
            epsilon=_frac(charge.epsilon),
            delta=_frac(charge.delta),
            dimension=charge.dimension,
        )
    if isinstance(charge, RandomizedResponseCharge):
        return RandomizedResponseModel(
            epsilon=_frac(charge.epsilon), categories=charge.categories
        )
    if isinstance(charge, BoundedRangeCharge):
        return BoundedRangeModel(epsilon=_frac(charge.epsilon))
    if isinstance(charge, Subsampled):
        return SubsampledModel(
            charge=_encode(charge.charge), rate=_frac(charge.rate), scheme=charge.scheme
        )
    if isinstance(charge, Parallel):
        return ParallelModel(
            partitions=[_encode(p) for p in charge.partitions], relation=charge.relation
        )
    if isinstance(charge, Repeated):
        return RepeatedModel(charge=_encode(charge.charge), count=charge.count)
    raise InvalidCostError("charge", charge, "this kind of charge cannot be stored")


def decode_charge(model: ChargeModel) -> Charge:
    """Rebuild a charge from its serialised form (validating it again).

    Raises:
        InvalidCostError: An invalid value, or a tree nested deeper than
            `dpaccount.charges.MAX_NESTING` levels (refused as it is rebuilt).
    """
    if isinstance(model, CostModel):
        return PrivacyCost(_unfrac(model.epsilon), _unfrac(model.delta))
    if isinstance(model, LaplaceModel):
        return LaplaceCharge(_unfrac(model.scale), _unfrac(model.sensitivity))
    if isinstance(model, GaussianModel):
        return GaussianCharge(
            _unfrac(model.sigma), _unfrac(model.sensitivity), _unfrac(model.epsilon)
        )
    if isinstance(model, DiscreteLaplaceModel):
        return DiscreteLaplaceCharge(
            _unfrac(model.scale), _unfrac(model.sensitivity), model.dimension
        )
    if isinstance(model, DiscreteGaussianModel):
        return DiscreteGaussianCharge(
            _unfrac(model.sigma),
            _unfrac(model.sensitivity),
            _unfrac(model.epsilon),
            _unfrac(model.delta),
            model.dimension,
        )
    if isinstance(model, RandomizedResponseModel):
        return RandomizedResponseCharge(_unfrac(model.epsilon), model.categories)
    if isinstance(model, BoundedRangeModel):
        return BoundedRangeCharge(_unfrac(model.epsilon))
    if isinstance(model, SubsampledModel):
        return Subsampled(decode_charge(model.charge), _unfrac(model.rate), model.scheme)
    if isinstance(model, ParallelModel):
        return Parallel(tuple(decode_charge(p) for p in model.partitions), model.relation)
    return Repeated(decode_charge(model.charge), model.count)


def encode_record(record: LedgerRecord) -> RecordModel:
    """The serialised form of a record."""
    cost = record.cost
    return RecordModel(
        seq=record.seq,
        label=record.label,
        charge=encode_charge(record.charge),
        cost=CostModel(epsilon=_frac(cost.epsilon), delta=_frac(cost.delta)),
        rule=record.rule,
        timestamp=record.timestamp,
        query_id=record.query_id,
    )


#: Decoded (charge, cost) pairs by their validated serialised form (`_fingerprint`): a
#: ledger repeats a few charges many times, and rebuilding and re-checking each is most of
#: a decode.
_DECODED: dict[tuple[Any, ...], tuple[Charge, PrivacyCost]] = {}
_DECODED_MAX = 4096


def _fingerprint(model: pydantic.BaseModel, level: int = 1) -> tuple[Any, ...]:
    """A hashable value equal for two validated models exactly when they are equal: the
    model's class and its field values, nested models and lists of them taken apart the
    same way. (The models themselves are not hashable when they hold a list, and their
    ``__eq__`` is slower than this.) ``level`` is the model's depth in its charge tree.

    Raises:
        LedgerCorruptError: The tree is nested deeper than `MAX_NESTING` levels (no
            dpaccount writer stores one), before the walk goes deeper than that.

    Examples:
        >>> _fingerprint(CostModel(epsilon="1/2", delta="0/1"))
        (<class 'dpaccount.records.models.CostModel'>, 'cost', '1/2', '0/1')
    """
    if not isinstance(model, SubsampledModel | ParallelModel | RepeatedModel):
        return (type(model), *model.__dict__.values())  # every field a str, int or enum
    if level >= MAX_NESTING:  # its parts would be deeper than the limit
        raise LedgerCorruptError(
            f"a stored charge is nested deeper than {MAX_NESTING} levels; no dpaccount "
            "writer stores one"
        )
    below = level + 1
    return (type(model), *(
        _fingerprint(value, below) if isinstance(value, pydantic.BaseModel)
        else tuple([_fingerprint(v, below) for v in value]) if isinstance(value, list)
        else value
        for value in model.__dict__.values()
    ))


def _charge_and_cost(model: RecordModel) -> tuple[Charge, PrivacyCost]:
    key = (_fingerprint(model.charge), model.cost.epsilon, model.cost.delta)
    found = _DECODED.get(key)
    if found is not None:
        return found
    charge = decode_charge(model.charge)
    cost = PrivacyCost(_unfrac(model.cost.epsilon), _unfrac(model.cost.delta))
    from dpaccount.charges import cost_of

    if cost_of(charge) != cost:
        raise LedgerCorruptError(
            f"record {model.seq}: the stored cost {cost} does not match its charge",
            seq=model.seq,
        )
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.clear()
    _DECODED[key] = (charge, cost)
    return charge, cost


_RECORD_VALIDATOR: Final = RecordModel.__pydantic_validator__


def decode_record(data: RecordModel | dict[str, Any] | str | bytes) -> LedgerRecord:
    """Validate and rebuild a record; any defect raises `LedgerCorruptError`."""
    try:
        if isinstance(data, str | bytes):  # stored rows: the common case, validated directly
            model = _RECORD_VALIDATOR.validate_json(data)
        elif isinstance(data, RecordModel):
            model = data
        else:
            model = RecordModel.model_validate(data)
        charge, cost = _charge_and_cost(model)
        timestamp = model.timestamp.astimezone(UTC)
    except (pydantic.ValidationError, InvalidCostError, ValueError, ZeroDivisionError,
            OverflowError) as exc:  # (a time that leaves the calendar in UTC overflows)
        raise LedgerCorruptError(f"a stored record is invalid: {exc}") from exc
    return LedgerRecord(
        seq=model.seq,
        label=model.label,
        charge=charge,
        cost=cost,
        rule=model.rule,
        timestamp=timestamp,
        query_id=model.query_id,
    )
