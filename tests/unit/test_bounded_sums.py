"""Cached running sums stay bounded, round up, and agree between Python and PL/pgSQL
(issue: integrity, item 4).

Sums of costs with pairwise coprime denominators grow without bound when kept exact
(79 charges of 1/(10^100 + k) once made a 8000-digit sum). The cache keeps them exact
while their denominators fit in ``SUM_BITS`` bits and rounds them up beyond that.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from storage_helpers import PG_URL, pg_schema

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.errors import LedgerCorruptError
from dpaccount.storage._sql import SUM_BITS, bounded_sum, frac_text, parse_frac

COPRIME = [Fraction(1, 10**100 + k) for k in range(60)]


@given(st.integers(0, 2**9000), st.integers(1, 2**9000))
def test_bounded_sum_rounds_up_by_less_than_one_unit(num: int, den: int) -> None:
    value = Fraction(num, den)
    rounded = bounded_sum(value)
    assert rounded >= value
    assert rounded - value < Fraction(1, 2**SUM_BITS)
    assert rounded.denominator.bit_length() <= SUM_BITS + 1
    if value.denominator.bit_length() <= SUM_BITS:
        assert rounded == value


@given(st.lists(st.sampled_from(["0.1", "1e-300", "2.5e-17", 0.1, 1e-300, 5e-324]),
                max_size=30))
def test_sums_of_floats_and_decimals_stay_exact(costs: list[Any]) -> None:
    exact = sum((PrivacyCost(c).epsilon for c in costs), Fraction(0))
    running = Fraction(0)
    for c in costs:
        running = bounded_sum(running + PrivacyCost(c).epsilon)
    assert running == exact


@pytest.fixture
def pg_url() -> Iterator[str]:
    for schema in pg_schema():
        yield f"{PG_URL}?schema={schema}"


def _cached(url: str, name: str) -> tuple[str, str]:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            row = conn.execute("SELECT epsilon_sum, delta_sum FROM ledgers WHERE name = ?",
                               (name,)).fetchone()
        conn.close()
        return str(row[0]), str(row[1])
    import psycopg

    schema = url.split("schema=")[1]
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute(f'SELECT epsilon_sum, delta_sum FROM "{schema}".ledgers '
                           "WHERE name = %s", (name,)).fetchone()
    return str(row[0]), str(row[1])


@pytest.mark.parametrize("rule", ["basic", "filter"])
def test_python_and_postgres_keep_the_same_bounded_sums(tmp_path: Path, pg_url: str,
                                                        rule: str) -> None:
    # basic: PostgreSQL's server-side function adds and rounds; filter: the client does.
    budget = Budget(1, "1e-5") if rule == "basic" else Budget(100, "1e-5")
    texts = []
    for url in (f"sqlite:///{tmp_path / 's.db'}", pg_url):
        acct = open_ledger(url, name="S", budget=budget, rule=rule)
        for cost in COPRIME:
            acct.charge(PrivacyCost(cost, cost / 10**6))
        acct.store.close()
        again = open_ledger(url, name="S", budget=budget, rule=rule)  # verifies
        again.charge(PrivacyCost("0.01"))
        again.store.close()
        texts.append(_cached(url, "S"))
    assert texts[0] == texts[1]  # PL/pgSQL numeric == Python Fraction, digit for digit
    eps = parse_frac(texts[0][0], "epsilon_sum")
    exact = sum(COPRIME, Fraction(1, 100))
    assert eps.denominator.bit_length() <= SUM_BITS + 1
    assert 0 <= eps - exact < Fraction(len(COPRIME) + 1, 2**SUM_BITS)


def test_a_cache_from_before_bounding_still_verifies_and_an_under_count_does_not(
    tmp_path: Path,
) -> None:
    # Ledgers written before sums were bounded cached the exact sum; they must keep
    # opening, also after new (rounded) charges. A cache below the exact sum is corrupt.
    db = tmp_path / "old.db"
    url = f"sqlite:///{db}"
    acct = open_ledger(url, name="S", budget=Budget(1))
    for cost in COPRIME[:20]:
        acct.charge(PrivacyCost(cost))
    acct.store.close()
    exact = sum(COPRIME[:20], Fraction(0))
    assert exact.denominator.bit_length() > SUM_BITS

    def set_cache(value: Fraction) -> None:
        from dpaccount.storage.sqlite.schema import SCHEMA

        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER IF EXISTS ledgers_tip_moves_forward")
            conn.execute("UPDATE ledgers SET epsilon_sum = ?", (frac_text(value),))
            # the trigger stood when the old code wrote the cache (writers refuse to
            # charge while it is missing)
            conn.execute(next(s for s in SCHEMA if "ledgers_tip_moves_forward" in s))
        conn.close()

    set_cache(exact)  # what the code before bounding wrote
    old = open_ledger(url, name="S", budget=Budget(1))
    old.charge(PrivacyCost(COPRIME[20]))
    old.store.close()
    open_ledger(url, name="S", budget=Budget(1)).store.close()

    set_cache(exact + COPRIME[20] - Fraction(1, 2**5000))  # a hair below: an under-count
    with pytest.raises(LedgerCorruptError, match="cached totals"):
        open_ledger(url, name="S", budget=Budget(1))


_FRACTIONS = st.builds(Fraction, st.integers(0, 2**5000), st.integers(1, 2**5000))


def _payload(eps: Fraction, delta: Fraction) -> str:
    return ('{"charge":{},"cost":{"delta":"' + frac_text(delta) + '","epsilon":"'
            + frac_text(eps) + '","kind":"cost"},"label":"\\"cost\\":{\\"delta\\":\\"0/1\\""}')


@given(_FRACTIONS, _FRACTIONS, _FRACTIONS, st.integers(1, 10**6))
def test_the_sqlite_trigger_check_accepts_exactly_the_bounded_sum(
    old: Fraction, eps: Fraction, delta: Fraction, nudge: int
) -> None:
    from dpaccount.storage._sql import sums_follow

    payload = _payload(eps, delta)
    eps_sum, delta_sum = bounded_sum(old + eps), bounded_sum(old + delta)
    assert sums_follow(frac_text(old), frac_text(old), frac_text(eps_sum),
                       frac_text(delta_sum), payload)
    off = eps_sum - Fraction(1, nudge * 2**SUM_BITS)  # any other value is refused
    assert not sums_follow(frac_text(old), frac_text(old), frac_text(off),
                           frac_text(delta_sum), payload)
    assert not sums_follow(frac_text(old), frac_text(old), frac_text(old),
                           frac_text(old), payload) or (eps_sum == old and delta_sum == old)


def test_postgres_adds_and_rounds_as_python_does(pg_url: str) -> None:
    # The PL/pgSQL addition behind the PostgreSQL tip trigger, against bounded_sum, on
    # values with and without rounding (two independent implementations).
    import random

    import psycopg

    from dpaccount.ledgers import open_store

    store: Any = open_store(pg_url, name="X")  # creates the schema and its functions
    store.close()
    schema = pg_url.split("schema=")[1]
    rng = random.Random(7)
    cases = [(Fraction(1, 3), Fraction(1, 6)), (Fraction(0), Fraction(5, 7))]
    for _ in range(40):
        bits = rng.choice([8, 200, 3000, 5000])
        cases.append((Fraction(rng.getrandbits(bits), rng.getrandbits(bits) | 1),
                      Fraction(rng.getrandbits(bits), rng.getrandbits(bits) | 1)))
    with psycopg.connect(PG_URL) as conn:
        for a, b in cases:
            got = conn.execute(f'SELECT "{schema}".dpaccount_add_bounded_v1(%s, %s)',
                               (frac_text(a), frac_text(b))).fetchone()[0]
            assert got == frac_text(bounded_sum(a + b))
