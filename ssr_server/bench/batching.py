"""How a forward's cost grows with the runs that share it: the most batching can give on this machine.

``bench serve`` compares 8 concurrent runs with 1; the engine can only make 8 cheaper than 8 x 1 where a
forward of N runs' work costs less than N forwards of one. This bench measures that curve directly, at
engine level (no HTTP, no agent loop), for the two kinds of work a turn is made of:

- **decode**: N runs each feed one token on its own cached ~``past_tokens``-token context (an action
  being decoded);
- **selection**: N runs each score the default library's candidates (the agent's own token ids) on its
  own cached context, log-probabilities included (``ModelRunner.score``: one forward, one log-softmax).

For N in ``levels`` it reports the median time of one such forward over ``repeats`` and ``sharing`` =
N x t(1) / t(N): 1.0 when batching buys nothing (compute-bound work), N when N runs cost what one does
(small batches on a GPU, bound by reading the weights). Figures are printed, never asserted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ssr_server.bench.mixed import long_context
from ssr_server.bench.report import median_ms, write_json
from ssr_server.core.protocol import Context

LEVELS = (1, 2, 4, 8)


def run_batching_bench(engine: Any, levels: Sequence[int] = LEVELS, past_tokens: int = 600,
                       repeats: int = 9, json_path: str | None = None) -> dict[str, Any]:
    """Forward time of N decode steps and of N selections, each run on its own cached context.

    ``engine``: an embedded ``TorchEngine`` whose worker is idle (the runner is driven on this thread)."""
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry
    from ssr_server.engine.torch.runner import Chunk

    levels = sorted({int(n) for n in levels})
    if not levels or levels[0] < 1 or repeats < 1 or past_tokens < 1:
        raise ValueError("levels, repeats and past_tokens must be >= 1")
    runner, tok = engine.runner, engine.tokenizer
    fmt = get_format()
    library = LibraryRegistry().get("default")
    cands = [list(c) for c in library.candidate_token_ids(tok, fmt.candidate_surfaces(library))]
    entries = []
    for salt in range(levels[-1]):  # distinct contexts: no run shares another's past
        p = runner.prepare(Context(tuple(long_context(tok, past_tokens, 7_000 + salt))),
                           reserve=sum(map(len, cands)))
        runner.prefill([p])
        entries.append(runner.finish_prefill(p))
    dims = 3 if runner.lm.is_vl else 1
    token = cands[0][0]

    def decode(n: int) -> None:
        import torch

        runner.forward([Chunk(e.kv, [token], torch.full((dims, 1), e.next_pos, dtype=torch.long,
                                                          device=runner.device), [0], past_len=e.kv.length)
                        for e in entries[:n]])

    def select(n: int) -> None:
        runner.score([(e, cands) for e in entries[:n]])

    rows = []
    for n in levels:
        rows.append({"runs": n, "decode_ms": median_ms(lambda n=n: decode(n), repeats),  # type: ignore[misc]
                     "selection_ms": median_ms(lambda n=n: select(n), repeats)})  # type: ignore[misc]
    base = rows[0]
    for row in rows:
        k = row["runs"] / base["runs"]
        row["decode_sharing"] = k * base["decode_ms"] / row["decode_ms"]
        row["selection_sharing"] = k * base["selection_ms"] / row["selection_ms"]
    result = {"bench": "batching", "model": engine.model_name, "device": str(runner.device),
              "past_tokens": [e.kv.length for e in entries], "candidate_tokens": [len(c) for c in cands],
              "repeats": repeats, "levels": rows}
    if json_path:
        write_json(json_path, result)
    return result


def format_batching(r: dict[str, Any]) -> str:
    pasts = r["past_tokens"]
    lines = [f"batching: {r['model']} on {r['device']}, contexts of {min(pasts)}-{max(pasts)} tokens, "
             f"candidates of {sum(r['candidate_tokens'])} tokens in all, median of {r['repeats']}",
             f"{'runs':>5} {'decode ms':>10} {'sharing':>8} {'selection ms':>13} {'sharing':>8}",
             "-" * 48]
    for row in r["levels"]:
        lines.append(f"{row['runs']:>5} {row['decode_ms']:>10.2f} {row['decode_sharing']:>7.2f}x "
                     f"{row['selection_ms']:>13.2f} {row['selection_sharing']:>7.2f}x")
    lines.append("sharing = N x t(1) / t(N): 1x when batching buys nothing, Nx when N runs cost as one")
    return "\n".join(lines)
