"""Two real SGLang CPU workers serving the shipped model behind SGLang's real router (sglang-router from
PyPI, ``--policy manual``), started once for the module by scripts/sglang-router.sh, and ssr-server
(a real uvicorn on 127.0.0.1) pointed at the router. The first run builds the router's venv (about
20 s); the workers start in parallel (about 60-80 s on 2 busy cores). SSR_SGLANG_TESTS=0 skips them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ssr_server.bench.router_harness import HarnessError, RouterHarness
from ssr_server.models import default_model_dir


@pytest.fixture(scope="module")
def stack() -> Iterator[RouterHarness]:
    h = RouterHarness(model=str(default_model_dir()), policy="manual")
    try:
        h.venvs()
        h.up()
    except HarnessError as exc:
        h.down()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield h
    finally:
        h.down()
