"""PostgreSQL ledgers behind PgBouncer: session pooling works, per-transaction pooling is
refused with a clear message (issue: integrity, item 5).

Each test starts its own PgBouncer (Debian's ``pgbouncer`` package) in front of the test
server. Without the binary the tests skip; ``DPACCOUNT_REQUIRE_PGBOUNCER=1`` (set by
``.ci/run``) makes them fail instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from liveness import LIVENESS_SECONDS, wait_for
from storage_helpers import PG_URL, need_postgres

from dpaccount import Budget, PrivacyCost, open_ledger
from dpaccount.errors import BudgetExceededError, ConfigError


def _need_pgbouncer() -> str:
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if binary is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("DPACCOUNT_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(f"DPACCOUNT_REQUIRE_PGBOUNCER=1 but {reason}")
        pytest.skip(reason)
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def bouncer() -> Iterator[Callable[[str, int], str]]:
    """Start PgBouncer in a pool mode and size; yields a function returning its URL."""
    need_postgres()
    binary = _need_pgbouncer()
    target = urlsplit(PG_URL)
    user = target.username or "postgres"
    started: list[Path] = []
    # Not under pytest's tmp_path: PgBouncer drops root for the postgres user, who must
    # reach its files (pytest's base directory is private to the user running it).
    tmp_path = Path(tempfile.mkdtemp(prefix="dpaccount-pgbouncer-"))
    tmp_path.chmod(0o777)

    def start(mode: str, pool_size: int) -> str:
        port = _free_port()
        base = tmp_path / f"{mode}{port}"
        (tmp_path / "users.txt").write_text(f'"{user}" ""\n')
        base.with_suffix(".ini").write_text(
            f"[databases]\ntest = host={target.hostname} port={target.port or 5432} "
            f"dbname={target.path.lstrip('/')}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
            f"listen_port = {port}\nauth_type = trust\nauth_file = {tmp_path}/users.txt\n"
            f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nunix_socket_dir =\n"
            f"logfile = {base}.log\npidfile = {base}.pid\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        for path in tmp_path.iterdir():
            path.chmod(0o666)
        command = [binary, "-d"]
        if os.geteuid() == 0:  # PgBouncer does not run as root
            command += ["-u", "postgres"]
        subprocess.run([*command, str(base.with_suffix(".ini"))], check=True,
                       timeout=LIVENESS_SECONDS)
        started.append(base.with_suffix(".pid"))
        wait_for(lambda: _listening(port), f"PgBouncer to listen on port {port}")
        return f"postgresql://{user}@127.0.0.1:{port}/test"

    yield start
    for pidfile in started:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), 15)
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def schema() -> Iterator[str]:
    from storage_helpers import pg_schema

    yield from pg_schema()


def test_session_pooling_works(bouncer: Callable[[str, int], str], schema: str) -> None:
    url = f"{bouncer('session', 4)}?schema={schema}"
    acct = open_ledger(url, name="B", budget=Budget(1))
    for _ in range(4):
        acct.charge(PrivacyCost("0.25"))
    with pytest.raises(BudgetExceededError):
        acct.charge(PrivacyCost("0.25"))
    acct.store.close()
    again = open_ledger(url, name="B", budget=Budget(1))
    assert again.spent == PrivacyCost(1)
    assert again.store.verify().head == 4  # type: ignore[attr-defined]
    again.store.close()


@pytest.mark.parametrize("pool_size", [1, 4])
def test_transaction_pooling_is_refused_before_anything_is_written(
    bouncer: Callable[[str, int], str], schema: str, pool_size: int
) -> None:
    url = f"{bouncer('transaction', pool_size)}?schema={schema}"
    with pytest.raises(ConfigError, match="pool_mode = session"):
        open_ledger(url, name="B", budget=Budget(1))
    direct = open_ledger(f"{PG_URL}?schema={schema}", name="B", budget=Budget(1))
    assert direct.records == []  # nothing was created or charged through the pooler
    direct.store.close()


def test_statement_pooling_is_refused(bouncer: Callable[[str, int], str], schema: str
                                      ) -> None:
    url = f"{bouncer('statement', 2)}?schema={schema}"
    with pytest.raises(ConfigError, match="pool_mode = session"):
        open_ledger(url, name="B", budget=Budget(1))
