"""Fixtures of the run store's tests: a store in a temporary folder (SQLite) or in a throwaway PostgreSQL
cluster started here (Debian's ``postgresql``, run as the ``postgres`` user when the tests run as root),
real servers on 127.0.0.1 that keep their runs there, and runs that last as long as a test wants: every
move of the ``gated`` library is a text search, and the search backend (a SearxNG stand-in on 127.0.0.1)
answers the first searches at once and holds the others until the test opens the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ssr_server.bench.serve import live_server
from ssr_server.core.config import Settings

LIBRARY = """\
name: gated
description: Every move is a text search (the tests' search backend decides when each one answers).
candidates:
  - id: look_up
    text: I should look this up with a text search before I answer.
    action: text_search
"""
GATED = {"question": "Who built this?", "mode": "ssr", "library": "gated", "max_turns": 6}


@pytest.fixture()
def search(gated_search: Any) -> Iterator[Any]:
    s = gated_search(free=1)
    yield s
    s.close()


@pytest.fixture(scope="session")
def library_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("libraries")
    (d / "gated.yaml").write_text(LIBRARY)
    return d


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.sqlite3'}"


@pytest.fixture(scope="session")
def stored(torch_engine: Any, demo_tools: Any, library_dir: Path) -> Callable[..., Any]:
    """``with stored(store_url, search=None, **settings) as url:`` a real server keeping its runs in
    ``store_url``; with ``search`` its text search is that backend (else the demo world's tools)."""

    @contextlib.contextmanager
    def _serve(store_url: str, search: Any = None, **kw: Any) -> Iterator[str]:
        settings = Settings(run_store=store_url, library_dirs=(str(library_dir),),
                            searxng_url=search.url if search else None, max_concurrent_runs=4,
                            max_queued_runs=8, **kw)
        with live_server(settings, torch_engine, None if search else demo_tools) as url:
            yield url

    return _serve


def wait_for(predicate: Callable[[], Any], timeout_s: float = 60.0, what: str = "a condition") -> Any:
    """Poll until ``predicate()`` is truthy; its value. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def get_run(url: str, run_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/agent/runs/{run_id}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# ---- PostgreSQL ------------------------------------------------------------------------------------
def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, user ``ssr``); its base URL."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL is not installed here (Debian package postgresql; scripts/test.sh installs "
                    "it with apt-get)")
    root = os.geteuid() == 0
    as_pg = ["runuser", "-u", "postgres", "--"] if root else []
    d = Path(tempfile.mkdtemp(prefix="ssr-pg-"))
    if root:
        shutil.chown(d, "postgres")
    port = _free_port()
    try:
        subprocess.run([*as_pg, str(pg / "initdb"), "-D", str(d / "data"), "-A", "trust", "-U", "ssr"],
                       check=True, capture_output=True, timeout=120)
        opts = f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        subprocess.run([*as_pg, str(pg / "pg_ctl"), "-D", str(d / "data"), "-w", "-t", "60", "-l",
                        str(d / "log"), "-o", opts, "start"], check=True, capture_output=True, timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc}\n{getattr(exc, 'stderr', b'')!r}")
    try:
        yield f"postgresql://ssr@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_pg, str(pg / "pg_ctl"), "-D", str(d / "data"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def postgres_url(postgres_server: str) -> str:
    """A new, empty database on the session's cluster."""
    import asyncpg

    name = f"t{time.time_ns()}"

    async def create() -> None:
        conn = await asyncpg.connect(f"{postgres_server}/postgres")
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return f"{postgres_server}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="session")
def kit(gated_search: Any) -> Any:
    """The helpers above, for test modules (which cannot import a conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(GATED=GATED, get_run=get_run, wait_for=wait_for, GatedSearch=gated_search)


@pytest.fixture(scope="session")
def demo_png_b64() -> str:
    import base64
    import io

    from ssr_server.tools.demo import demo_picture, shipped_demo_world

    buf = io.BytesIO()
    demo_picture(shipped_demo_world().entity_ids()[0]).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()
