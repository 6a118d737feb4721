"""``bench logprobs``: a selection's per-token log-probabilities through the output head, two ways.

Every candidate token needs log p(token | row): the head's logits over the whole vocabulary and their
log-normaliser. Side by side, on the same ``rows`` hidden states (the default library's 357 candidate
tokens, or a multiple: N runs in one forward) and the model's own head:

- ``whole``: ``log_softmax(head(hidden)).gather(targets)`` - the (rows, vocab) logits and a second
  (rows, vocab) tensor for the log-softmax (the engine also concatenated them per job: a third);
- ``blockwise``: ``scoring.token_logprobs``, the engine's way: a block of the vocabulary at a time, an
  online log-sum-exp, nothing of size (rows, vocab).

Reported: the median ms of each (interleaved repeats, so machine noise hits both alike), their ratio,
the largest difference between the two, and the bytes of the largest float32 tensors each creates,
computed from the shapes (a CPU has no allocator counter to read).
Printed, never asserted.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ssr_server.bench.report import write_json
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.scoring import VOCAB_BLOCK, token_logprobs

ROWS = 357  # the default library's six candidates, as the shipped tokenizer splits them


def _ms(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


@torch.inference_mode()
def run_logprobs_bench(lm: LoadedModel, rows: int = ROWS, repeats: int = 5,
                       json_path: str | None = None, seed: int = 0) -> dict[str, Any]:
    if rows < 1 or repeats < 1:
        raise ValueError("rows and repeats must be >= 1")
    head = lm.lm_head
    vocab, width = int(head.weight.shape[0]), int(head.weight.shape[1])
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g).to(device=lm.device, dtype=lm.dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g).to(lm.device)

    def whole() -> torch.Tensor:
        return torch.log_softmax(head(hidden).float(), dim=-1).gather(1, targets.view(-1, 1))[:, 0]

    def blockwise() -> torch.Tensor:
        return token_logprobs(head, hidden, targets)

    diff = float((whole() - blockwise()).abs().max())  # also the warm-up
    t_whole, t_block = [], []
    for _ in range(repeats):
        t_whole.append(_ms(whole))
        t_block.append(_ms(blockwise))
    result: dict[str, Any] = {
        "model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "vocab": vocab, "rows": rows,
        "repeats": repeats, "threads": torch.get_num_threads(),
        "whole_ms": statistics.median(t_whole), "blockwise_ms": statistics.median(t_block),
        "max_abs_diff": diff,
        "whole_largest_bytes": 2 * rows * vocab * 4,
        "blockwise_largest_bytes": rows * min(vocab, VOCAB_BLOCK) * 4,
    }
    result["blockwise_over_whole"] = result["blockwise_ms"] / result["whole_ms"]
    if json_path:
        write_json(json_path, result)
    return result


def format_logprobs(r: dict[str, Any]) -> str:
    mib = 1 << 20
    return "\n".join([
        f"log-probabilities of {r['rows']} rows through the head of {r['model']} ({r['dtype']}, "
        f"vocabulary {r['vocab']:,}, {r['threads']} threads, median of {r['repeats']})",
        f"  whole (log-softmax of the logits):  {r['whole_ms']:9.2f} ms   "
        f"largest tensors {r['whole_largest_bytes'] / mib:8.1f} MiB",
        f"  blockwise (the engine's):            {r['blockwise_ms']:9.2f} ms   "
        f"largest tensors {r['blockwise_largest_bytes'] / mib:8.1f} MiB",
        f"  blockwise / whole: {r['blockwise_over_whole']:.3f}   max abs diff: {r['max_abs_diff']:.2e}",
    ])
