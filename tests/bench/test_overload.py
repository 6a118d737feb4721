"""``bench overload --admission`` end to end on a small scale: a fresh `ssr-server serve` per case, the
plain client (the body sent whole) against an idle server. Only what the bench establishes is asserted
(who was admitted, who sent a body, that every figure is there); its timings and memory are printed,
never asserted (no wall-clock tests)."""

from __future__ import annotations

import pytest

from ssr_server.bench.admission import format_admission, run_admission_bench


def test_admission_bench_small(capsys: pytest.CaptureFixture[str]) -> None:
    # One case (each is a fresh server, seconds to start): the plain client against an idle server runs
    # the most of the bench's code (the upload sink, the burst, the admitted run); tests/hardening covers
    # the behaviour of both clients against full and idle servers.
    r = run_admission_bench(bursts=(6,), clients=("plain",), states=("idle",), images=1, width=64, height=64,
                            reasoning_budget=2048, max_turns=1, model="tiny-random", timeout_s=120)
    assert [(c.client, c.state) for c in r.cases] == [("plain", "idle")]
    for c in r.cases:
        want = {"429": 6} if c.state == "full" else {"200": 1, "429": 5}
        assert c.statuses == want, c
        assert c.admitted == 1, c  # the request that filled the server, or the one the burst got in
        assert c.bodies_sent == (6 if c.client == "plain" else want.get("200", 0)), c
        assert c.refused_max_s > 0 and c.growth_mb > 0, c
    assert all(c.upload_max_s > 0 for c in r.cases if c.client == "plain")
    text = format_admission(r)
    print(text)
    assert text.count("\nplain ") == 1 and "floors:" in text
