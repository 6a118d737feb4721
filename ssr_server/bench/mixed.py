"""Mixed load: the inter-token latency of one decoding run while another run prefills a long context.

Engine level (no HTTP, no agent loop), so it measures the scheduler alone: one run decodes
``decode_tokens`` tokens (greedy, EOS ignored) on a short chat context; ``undisturbed`` is that run
alone, ``mixed`` the same run with a second run that, once ``start_after`` tokens are out, scores the
default six candidates on a fresh ~``long_tokens``-token context (so the engine must prefill it).
Inter-token latencies (ITL) are the gaps between the forwards that produced the decoding run's tokens,
timed by a tap on ``engine.runner.forward`` (the decoding run is the only one-token chunk
of every forward it is in); for ``mixed`` only the gaps that overlap the long prefill count. The
variants alternate ``repeats`` times in one process; pooled p50/p95 are reported, and the floor is
``mixed p95 <= 2 x undisturbed p95``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ssr_server.bench.actions import set_drafts

FLOOR_ITL_RATIO = 2.0
LONG_TOKENS = 4000
_SALTS = itertools.count(int(time.time()))

_FILLER = (
    "Eiffel Tower - Wikipedia. The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in "
    "Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built it. "
    "Built for the 1889 World's Fair, the tower was the tallest structure in the world until 1930. "
    "Work on the foundations began in January 1887 and the tower was completed on 31 March 1889. "
)


@dataclass
class _Tap:
    """Completion times of forwards, with the one-token chunks' pasts (decode steps) of each."""

    times: list[float] = field(default_factory=list)
    decoders: list[set[int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    want: int = 0  # ``reached`` is set once this many forwards carried a decode step
    reached: threading.Event = field(default_factory=threading.Event)
    _decode_forwards: int = 0

    def record(self, chunks: list[Any]) -> None:
        ones = {id(c.past) for c in chunks if len(c.ids) == 1 and c.past is not None}
        with self.lock:
            self.times.append(time.perf_counter())
            self.decoders.append(ones)
            self._decode_forwards += bool(ones)
            if self._decode_forwards >= self.want:
                self.reached.set()

    def token_times(self, since: int = 0) -> list[float]:
        """Times of the forwards that advanced the decoding run (the past seen in most forwards)."""
        with self.lock:
            counts: dict[int, int] = {}
            for ones in self.decoders[since:]:
                for k in ones:
                    counts[k] = counts.get(k, 0) + 1
            if not counts:
                return []
            run = max(counts, key=lambda k: counts[k])
            pairs = zip(self.times[since:], self.decoders[since:], strict=True)
            return [t for t, ones in pairs if run in ones]


@contextlib.contextmanager
def forward_tap(engine: Any, want: int = 0) -> Iterator[_Tap]:
    """Record every forward of ``engine``'s runner (an instance attribute, restored afterwards)."""
    runner = engine.runner
    inner = runner.forward
    tap = _Tap(want=want)

    def forward(chunks: list[Any], *args: Any, **kwargs: Any) -> Any:
        out = inner(chunks, *args, **kwargs)
        tap.record(chunks)
        return out

    setattr(runner, "forward", forward)  # noqa: B010 - this runner only, for the measurement
    try:
        yield tap
    finally:
        delattr(runner, "forward")  # back to the class's method


def _chat(tok: Any, text: str) -> list[int]:
    messages = [{"role": "system", "content": "You are a visual search assistant."},
                {"role": "user", "content": text}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>\n"
    return list(tok.encode(rendered, add_special_tokens=False))


def long_context(tok: Any, tokens: int, salt: int) -> list[int]:
    """A chat context of about ``tokens`` tokens (at least), unique per ``salt`` (never cached)."""
    head = f"Request {salt}. Search results:"
    per_item = max(1, len(tok.encode(f"1. {_FILLER}\n", add_special_tokens=False)))
    n = max(0, (tokens - len(_chat(tok, head))) // per_item)
    while True:
        ids = _chat(tok, "\n".join([head, *(f"{i + 1}. {_FILLER}" for i in range(n))]))
        if len(ids) >= tokens:
            return ids
        n += 1


def _gaps(times: list[float], lo: float | None = None, hi: float | None = None) -> list[float]:
    """Gaps between consecutive token times; with [lo, hi], only those that overlap it."""
    out = []
    for a, b in itertools.pairwise(times):
        if lo is not None and hi is not None and (b <= lo or a >= hi):
            continue
        out.append(b - a)
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q / 100 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def _one(engine: Any, decode_ctx: Any, long_ctx: Any | None, cands: list[list[int]], n: int,
               start_after: int) -> tuple[list[float], float]:
    """Decode ``n`` tokens; with ``long_ctx``, score on it once ``start_after`` tokens are out.
    Returns the ITL gaps (overlapping the prefill when there is one) and the prefill's latency."""
    from ssr_server.core.protocol import GenerationParams

    params = GenerationParams(max_new_tokens=n, ignore_eos=True)
    with forward_tap(engine, want=start_after) as tap:
        gen = asyncio.ensure_future(engine.generate(decode_ctx, params))
        if long_ctx is None:
            await gen
            return _gaps(tap.token_times()), 0.0
        await asyncio.to_thread(tap.reached.wait, 60.0)
        t0 = time.perf_counter()
        await engine.score(long_ctx, cands)
        t1 = time.perf_counter()
        await gen
        return _gaps(tap.token_times(), t0, t1), t1 - t0


def run_mixed_bench(engine: Any, *, long_tokens: int = LONG_TOKENS, decode_tokens: int = 256,
                    start_after: int = 8, repeats: int = 5) -> dict[str, Any]:
    """ITL p50/p95 of a decoding run alone and during another run's long prefill; see the module doc."""
    from ssr_server.core.protocol import Context

    tok = engine.tokenizer
    cands = [list(tok.encode(t, add_special_tokens=False)) for t in (
        "I do not yet know what this object is, so searching with the image should identify it.\n",
        "I know what the entity is, but I need a specific fact, so a text search should find it.\n",
        "A detail in the image is too small to read; zooming in should make it clear.\n",
        "The evidence gathered so far answers the question, so I can answer now.\n",
        "The last search did not help; a different query should.\n",
        "Zoom in.\n")]
    decode_ctx = Context(tuple(_chat(tok, "Describe the tower in the picture in detail.")))
    alone: list[float] = []
    mixed: list[float] = []
    prefill_s: list[float] = []
    n_long = 0

    async def go() -> None:
        nonlocal n_long
        await _one(engine, decode_ctx, None, cands, 8, 0)  # warm-up: allocator, caches
        for _ in range(repeats):
            gaps, _ = await _one(engine, decode_ctx, None, cands, decode_tokens, 0)
            alone.extend(gaps)
            ids = long_context(tok, long_tokens, salt=next(_SALTS))  # never cached before
            n_long = len(ids)
            gaps, took = await _one(engine, decode_ctx, Context(tuple(ids)), cands, decode_tokens,
                                    start_after)
            mixed.extend(gaps)
            prefill_s.append(took)

    # one token per forward: inter-token latency is the gap between forwards (drafts, which put
    # several tokens in one forward, are measured by ``bench actions``)
    set_drafts(engine, False)
    try:
        asyncio.run(go())
    finally:
        set_drafts(engine, True)
    out: dict[str, Any] = {
        "long_context_tokens": n_long, "decode_tokens": decode_tokens, "repeats": repeats,
        "undisturbed_p50_ms": _pct(alone, 50) * 1e3, "undisturbed_p95_ms": _pct(alone, 95) * 1e3,
        "mixed_p50_ms": _pct(mixed, 50) * 1e3, "mixed_p95_ms": _pct(mixed, 95) * 1e3,
        "mixed_max_ms": max(mixed, default=float("nan")) * 1e3, "mixed_gaps": len(mixed),
        "long_score_ms": statistics.median(prefill_s) * 1e3 if prefill_s else float("nan"),
        "floor": FLOOR_ITL_RATIO,
        "samples_ms": {"undisturbed": [x * 1e3 for x in alone], "mixed": [x * 1e3 for x in mixed]},
    }
    out["p95_ratio"] = out["mixed_p95_ms"] / out["undisturbed_p95_ms"]
    out["floor_met"] = out["p95_ratio"] <= FLOOR_ITL_RATIO
    return out


def format_mixed(r: dict[str, Any]) -> str:
    return "\n".join([
        f"mixed load: one run decodes {r['decode_tokens']} tokens while another scores on a fresh "
        f"{r['long_context_tokens']}-token context ({r['repeats']} repeats, pooled)",
        f"  inter-token latency undisturbed   p50 {r['undisturbed_p50_ms']:.2f} ms   "
        f"p95 {r['undisturbed_p95_ms']:.2f} ms",
        f"  during the long prefill           p50 {r['mixed_p50_ms']:.2f} ms   p95 {r['mixed_p95_ms']:.2f} ms"
        f"   max {r['mixed_max_ms']:.1f} ms   ({r['mixed_gaps']} gaps)",
        f"  long context's prefill + scoring  {r['long_score_ms']:.1f} ms (median)",
        f"  p95 ratio {r['p95_ratio']:.2f}x (floor <= {r['floor']:g}x: "
        f"{'met' if r['floor_met'] else 'NOT met'})",
    ])


__all__ = ["FLOOR_ITL_RATIO", "format_mixed", "forward_tap", "long_context", "run_mixed_bench"]
