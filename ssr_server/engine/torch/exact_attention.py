"""Attention for exact draft rows: each row's bits are the same whichever rows share the call.

In reduced precision, attention over a chunk of queries rounds otherwise than over one query (SDPA's
CPU kernel sizes its blocks from the call's lengths), so a draft row and the one-token step it stands
for could differ in the last bit and greedy decoding flip at a near-tie. Calling SDPA once per row
(``one``) keeps the bits but reads the whole KV once per row. ``rows`` computes every row with the same
fixed shapes instead, whatever the call: the keys before the row's 64-key block in one flash call
(no mask: every row sees all of them), its own block, padded to 64 keys and masked past the row, in a
second, both with their log-sum-exp, combined in fp32 (split-KV decoding's merge). Rows whose own key
lies in the same block share both calls; measured here, SDPA's flash kernel gives each row the same
bits whether it is alone (as two: one row takes another path) or among 2 to 20, with or without a mask
of a fixed shape. A one-token step of an exact engine goes through ``rows`` too, so both sides of a
verification compute alike; so do its prefill rows, with every call padded to one shape (``fixed``),
so that a prompt's keys do not depend on where it was cut into chunks.
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK = 64  # keys of a row's own block: the second call's fixed length


def one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """(1, heads, 1, d): one query token's attention over all of k, v (no mask). Each KV group's query
    heads are folded into the query axis: the same result as enable_gqa without its repeat of K/V
    (measured 20-25% faster per call)."""
    heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[3]
    o = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(1, kv_heads, heads // kv_heads, d), k, v, scale=scaling)
    return o.reshape(1, heads, 1, d)


def rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, scaling: float | None,
         memo: dict[Any, torch.Tensor] | None = None, fixed: bool = False) -> torch.Tensor:
    """(1, heads, R, d) for q (1, heads, R, d): row r attends to keys [0, first + r] of k, v (its own key
    is at first + r), with the bits it gets in any other call of this function. ``memo``: kept across
    the layers of one forward (the masks and the padding are the same in every layer). ``fixed``: every
    block's call has ``BLOCK`` query rows (padded with copies of its last row): a prefill's rows get the
    same bits however the prompt is cut (calls of 2-20 rows agree with one another, measured, but a
    block's 22 rows and its 64 were seen to differ in one row of a real model's prompt)."""
    memo = {} if memo is None else memo
    out = q.new_empty(q.shape)
    n = q.shape[2]
    if q.device.type != "cpu":  # the flash kernel with its log-sum-exp used here is the CPU one
        for r in range(n):
            out[:, :, r : r + 1] = one(q[:, :, r : r + 1], k[:, :, : first + r + 1], v[:, :, : first + r + 1],
                                       scaling)
        return out
    r0 = 0
    while r0 < n:
        b = (first + r0) // BLOCK * BLOCK
        r1 = min(n, b + BLOCK - first)  # the rows whose own key lies in the block [b, b + BLOCK)
        visible = [first + r - b + 1 for r in range(r0, r1)]
        out[:, :, r0:r1] = _block(q[:, :, r0:r1], k, v, b, visible, scaling, memo, fixed)
        r0 = r1
    return out


def _block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int, visible: list[int],
           scaling: float | None, memo: dict[Any, torch.Tensor], fixed: bool = False) -> torch.Tensor:
    """Rows whose own keys lie in the block starting at key ``b``; ``visible[i]``: keys of the block row
    i sees."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    heads, m, d = q.shape[1], q.shape[2], q.shape[3]
    kv_heads = k.shape[1]
    if fixed and m < BLOCK:
        q = torch.cat([q, q[:, :, -1:].expand(-1, -1, BLOCK - m, -1)], dim=2)
        visible = visible + [visible[-1]] * (BLOCK - m)
    elif m == 1:  # one row takes another path through the kernel than two or more: as two, always
        q, visible = torch.cat([q, q], dim=2), visible * 2
    rows = q.shape[2]
    qf = q.reshape(1, kv_heads, heads // kv_heads * rows, d)  # fold each KV group's heads into rows
    kt, vt = k[:, :, b : b + BLOCK], v[:, :, b : b + BLOCK]
    if kt.shape[2] < BLOCK:
        short = BLOCK - kt.shape[2]
        pad = memo.get(("pad", short))
        if pad is None:
            pad = memo[("pad", short)] = torch.zeros(1, kv_heads, short, d, dtype=k.dtype, device=k.device)
        kt, vt = torch.cat([kt, pad], dim=2), torch.cat([vt, pad], dim=2)
    mask = memo.get(("mask", *visible))
    if mask is None:
        seen = torch.arange(BLOCK, device=q.device) < torch.tensor(visible, device=q.device).view(-1, 1)
        mask = torch.zeros(rows, BLOCK, dtype=q.dtype, device=q.device)
        mask.masked_fill_(~seen, torch.finfo(q.dtype).min)
        mask = memo[("mask", *visible)] = mask.repeat(heads // kv_heads, 1).view(1, 1, -1, BLOCK)
    o_own, lse_own = flash(qf, kt, vt, 0.0, False, attn_mask=mask, scale=scaling)[:2]
    if b == 0:
        o = o_own
    else:
        o_past, lse_past = flash(qf, k[:, :, :b], v[:, :, :b], 0.0, False, scale=scaling)[:2]
        top = torch.maximum(lse_past, lse_own)
        w_past, w_own = (lse_past - top).exp().unsqueeze(-1), (lse_own - top).exp().unsqueeze(-1)
        o = ((o_past.float() * w_past + o_own.float() * w_own) / (w_past + w_own)).to(q.dtype)
    result: torch.Tensor = o.reshape(1, heads, rows, d)[:, :, :m]
    return result
