"""Helpers for the storage tests: PostgreSQL availability, per-run schemas, and racing
processes."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from liveness import LIVENESS_SECONDS

PG_URL = os.environ.get("DPACCOUNT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("DPACCOUNT_REQUIRE_POSTGRES") == "1"


def postgres_reason() -> str | None:
    """None if the test server answers, else why the PostgreSQL tests are skipped."""
    try:
        import psycopg
    except ImportError:
        return 'psycopg is not installed (pip install "dpaccount[postgres]")'
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unreachable: {exc}"
    return None


def need_postgres() -> None:
    """Skip (or, with DPACCOUNT_REQUIRE_POSTGRES=1, fail) when PostgreSQL is missing."""
    reason = postgres_reason()
    if reason is None:
        return
    if REQUIRE_PG:
        pytest.fail(f"DPACCOUNT_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


def new_schema() -> str:
    """A schema name unique to this test run."""
    return f"dpacct_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"


def drop_schema(schema: str) -> None:
    """Drop a test schema and everything in it."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_schema() -> Iterator[str]:
    """Generator body for a fixture yielding a fresh schema, dropped afterwards."""
    need_postgres()
    schema = new_schema()
    try:
        yield schema
    finally:
        drop_schema(schema)


def pg_url(schema: str) -> str:
    """The ledger URL of the test server in ``schema``."""
    return f"{PG_URL}?schema={schema}"


def race(target: Callable[..., None], worker_args: list[tuple[Any, ...]]) -> list[Any]:
    """Fork one process per argument tuple, each running ``target(*args, start, out)``;
    release them all at once (``start``) and return what each put on ``out`` (one item
    each, in arrival order) once all have ended.

    It waits for the results as long as the workers live (up to the generous
    `liveness.LIVENESS_SECONDS`, so a loaded machine only makes it slower), and fails at
    once when every worker has ended and a result is missing (one died without putting
    it). A worker still running when it gives up is killed."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, start, out)) for args in worker_args]
    results: list[Any] = []
    try:
        for worker in workers:
            worker.start()
        start.set()
        deadline = time.monotonic() + LIVENESS_SECONDS
        while len(results) < len(workers):
            ended = not any(worker.is_alive() for worker in workers)
            try:  # after all ended, what they put is in the pipe: take it or fail
                results.append(out.get(timeout=5 if ended else 0.5))
            except queue.Empty:
                if ended:
                    codes = [worker.exitcode for worker in workers]
                    pytest.fail(f"{len(workers) - len(results)} racing worker(s) ended "
                                f"without a result (exit codes {codes})")
                if time.monotonic() > deadline:
                    pytest.fail(f"waited {LIVENESS_SECONDS:g} s for the racing workers")
        for worker in workers:  # each has put its result: it is ending by itself
            worker.join(LIVENESS_SECONDS)
    finally:
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                worker.kill()
                worker.join()
    return results
