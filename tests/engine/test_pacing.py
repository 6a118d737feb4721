"""The pacer sizes long-prefill chunks from measured costs: small until it knows them, then so that a
forward stays within the allowed slowdown, growing at most 2x per forward, within its bounds."""

from __future__ import annotations

from ssr_server.engine.torch.pacing import Pacer


def test_chunk_follows_costs() -> None:
    p = Pacer(slowdown=1.5, min_chunk=4, max_chunk=512)
    assert p.chunk() == 4  # nothing measured yet
    p.observe(0.001, 0)  # a decode-only forward: 1 ms
    assert p.chunk() == 4  # the per-token cost is still unknown
    p.used(4)
    p.observe(0.001 + 4 * 0.00001, 4)  # 10 us per prefill token: 50 tokens would cost 0.5 ms
    sizes = []
    for _ in range(8):
        n = p.chunk()
        sizes.append(n)
        p.used(n)
    assert sizes[:3] == [8, 16, 32] and set(sizes[3:]) <= {49, 50}  # doubling, then the target


def test_bounds_and_no_pacing() -> None:
    p = Pacer(slowdown=2.0, min_chunk=4, max_chunk=64, last=64)
    p.observe(0.001, 0)
    p.observe(0.001 + 1e-9, 10)  # nearly free tokens: the maximum
    assert p.chunk() == 64
    p = Pacer(slowdown=2.0, min_chunk=4, max_chunk=64, last=64)
    p.observe(0.001, 0)
    p.observe(1.0, 10)  # expensive tokens: the minimum
    assert p.chunk() == 4
    assert Pacer(slowdown=0, min_chunk=4, max_chunk=64).chunk() == 64  # pacing off
    p = Pacer(slowdown=1.5, min_chunk=4, max_chunk=64)
    p.observe(0.002, 0)
    p.observe(0.001, 10)  # faster than base: a marginal cost of zero, never negative
    assert p.per_token_s == 0.0


def test_heavier_forwards_allow_larger_chunks() -> None:
    """The allowance is relative: a forward that already scores 300 candidate tokens may carry more."""
    p = Pacer(slowdown=1.5, min_chunk=1, max_chunk=512, last=512)
    p.observe(0.001, 0)
    p.observe(0.001 + 10 * 1e-4, 10)  # 0.1 ms per token
    assert p.chunk() == 5 and p.chunk(other_tokens=300) == 155


def test_outliers_do_not_move_the_estimates() -> None:
    p = Pacer(slowdown=1.5, min_chunk=1, max_chunk=512)
    for _ in range(10):
        p.observe(0.001, 0)
    p.observe(0.050, 0)  # another process took the core for 50 ms
    assert p.base_s == 0.001
