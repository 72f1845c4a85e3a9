"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from storage_helpers import PG_URL, pg_schema

# Neither profile times anything (issue 28: the suite passes on a loaded machine): no
# deadline per example, and no "too slow" health check, which fails a test whose inputs
# take long to generate, as they do on a busy machine (the README's command runs "dev").
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# -- ledger URLs, one per durable backend ------------------------------------------------



@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite ledger file of its own."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL schema of its own, dropped afterwards (skips without PostgreSQL)."""
    for schema in pg_schema():
        yield f"{PG_URL}?schema={schema}"


@pytest.fixture(params=["sqlite_url", "pg_url"])
def url(request: pytest.FixtureRequest) -> str:
    """Each durable backend in turn."""
    return str(request.getfixturevalue(request.param))
