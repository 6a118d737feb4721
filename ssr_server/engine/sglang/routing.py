"""What the SGLang client says to SGLang's router and reads from it (checked against sglang-router 0.3.2).

- The routing key (header ``x-smg-routing-key``): a digest of the conversation's root, the context up
  to the start of its third message (system prompt, first user message) with that message's images.
  Every step of a run and every later request of the same conversation carry the same key; under
  ``--policy manual`` the router sends all requests of a key to one worker (new keys spread over the
  workers), so a run's selections find their prefix in that worker's radix cache. ``cache_aware``
  matches request text, and token-id requests carry none (measured: ``ssr-server bench router``).
- Its error code (header ``x-smg-error-code``): ``call_upstream_*`` (500: the worker it chose failed,
  e.g. it died) and ``no_available_workers`` (503: none is healthy).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ssr_server.core.protocol import Context

ROUTING_KEY_HEADER = "x-smg-routing-key"
ERROR_CODE_HEADER = "x-smg-error-code"
NO_WORKER = "no_available_workers"
UPSTREAM_FAILED = "call_upstream"  # the prefix of the codes for a worker that failed the request


def message_start_id(tokenizer: Any) -> int | None:
    """The chat template's message-start token (Qwen's ``<|im_start|>``), if the tokenizer has one."""
    tid = tokenizer.convert_tokens_to_ids("<|im_start|>")
    return tid if isinstance(tid, int) and tid != tokenizer.unk_token_id else None


def routing_key(ctx: Context, message_start: int | None, image_token_id: int | None) -> str:
    """The digest of the conversation's root (the whole context when it has fewer than three messages)."""
    ids, end = ctx.token_ids, len(ctx.token_ids)
    if message_start is not None:
        pos = -1
        for _ in range(3):
            try:
                pos = ids.index(message_start, pos + 1)
            except ValueError:
                pos = end
                break
        end = pos
    root = ids[:end]
    h = hashlib.blake2b(",".join(map(str, root)).encode(), digest_size=12)
    n_images = root.count(image_token_id) if image_token_id is not None else 0
    for img in ctx.images[:n_images]:
        h.update(img.digest.encode())
    return h.hexdigest()
