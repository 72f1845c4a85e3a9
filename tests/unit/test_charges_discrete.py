"""DiscreteLaplaceCharge / DiscreteGaussianCharge: values, costs and records."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaccount.charges import (
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    Repeated,
    Scheme,
    Subsampled,
    cost_of,
)
from dpaccount.costs import PrivacyCost
from dpaccount.errors import LedgerCorruptError
from dpaccount.records import (
    LedgerRecord,
    decode_charge,
    decode_record,
    encode_charge,
    encode_record,
)

positive = st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(10**4))


@settings(max_examples=100, deadline=None)
@given(scale=positive, steps=st.integers(1, 10**6), dim=st.integers(1, 16))
def test_discrete_laplace_cost_is_exact_and_round_trips(
    scale: Fraction, steps: int, dim: int
) -> None:
    c = DiscreteLaplaceCharge(scale, steps, dim)
    assert cost_of(c) == PrivacyCost(Fraction(steps) / scale)  # S / b exactly
    assert decode_charge(encode_charge(c)) == c
    wrapped = Repeated(Subsampled(c, "1/4", Scheme.POISSON), 3)
    assert decode_charge(encode_charge(wrapped)) == wrapped


@settings(max_examples=100, deadline=None)
@given(
    sigma=positive,
    steps=st.integers(1, 10**6),
    eps=st.fractions(min_value=0, max_value=50),
    delta=st.fractions(min_value=Fraction(1, 10**12), max_value=Fraction(1, 2)),
    dim=st.integers(1, 16),
)
def test_discrete_gaussian_cost_is_certified_pair_and_round_trips(
    sigma: Fraction, steps: int, eps: Fraction, delta: Fraction, dim: int
) -> None:
    c = DiscreteGaussianCharge(sigma, steps, eps, delta, dim)
    assert cost_of(c) == PrivacyCost(eps, delta)
    assert decode_charge(encode_charge(c)) == c


def test_record_kinds_and_tamper_detection() -> None:
    c = DiscreteGaussianCharge(Fraction(1111801, 1024), 257, 1, "1e-6")
    model = encode_charge(c)
    assert model.kind == "discrete_gaussian"
    assert encode_charge(DiscreteLaplaceCharge(3, 3)).kind == "discrete_laplace"
    record = LedgerRecord(0, "q", c, cost_of(c), "basic", datetime.now(UTC))
    payload = encode_record(record).model_dump(mode="json")
    assert decode_record(payload).charge == c
    payload["charge"]["delta"] = "1/2000000"  # the stored cost no longer matches
    with pytest.raises(LedgerCorruptError):
        decode_record(payload)
    payload["charge"]["delta"] = "0/1"  # a discrete Gaussian cannot be pure
    with pytest.raises(LedgerCorruptError):
        decode_record(payload)
