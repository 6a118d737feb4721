"""Decode speed of the embedded engine beside the memory-bandwidth limit of the model's weights.

A decode step of one sequence reads every weight of the decoder's linear layers and of the output head
once, plus the sequence's KV: it cannot be faster than those bytes over the machine's memory bandwidth.
This bench measures, in one run and on the same threads:

- **the limit**: bytes read per token / the rate of the fastest gemv this machine gives in the model's
  dtype (PyTorch's own kernel, and for bf16 on CPU also the oneDNN-packed one), over a matrix as large
  as the model's linear weights and at least 256 MiB (beyond any cache), measured in every round;
- **forward**: ms per decode step through ``ModelRunner.forward`` (one one-token chunk on a cached
  context), the model's work alone;
- **engine**: ms per token of a greedy ``TorchEngine.generate`` (scheduler, sampling and detokenizing
  included), ``new_tokens`` tokens with ``ignore_eos``.

For bf16 on a CPU both are measured with the weights as loaded (oneDNN-packed where ``auto`` packs them,
see ``engine/torch/cpu_bf16.py``) and with PyTorch's plain kernel. Rounds alternate the gemv and every
variant, so that a neighbour's load falls on all alike; each ratio to the limit is taken within its
round, and the medians are reported. Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from typing import Any

import torch
from torch import nn

from ssr_server.bench.report import median_ms, write_json

PROMPT = ("Write a short paragraph about the history of Paris, France: its founding, the river Seine, "
          "and three famous landmarks.")


class Gemv:
    """y = W x for a (rows, cols) ``dtype`` matrix of about ``nbytes`` (at least 256 MiB: no cache holds
    it), per kernel: ``torch`` (F.linear) and, for bf16 where oneDNN can, ``packed``."""

    def __init__(self, nbytes: int, dtype: torch.dtype, cols: int) -> None:
        from ssr_server.engine.torch.cpu_bf16 import can_pack

        size = torch.tensor([], dtype=dtype).element_size()
        self.weight = torch.randn(max(nbytes, 256 << 20) // (cols * size), cols).to(dtype)
        self.x = torch.randn(1, cols).to(dtype)
        self.nbytes = self.weight.numel() * size
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)
                       if dtype == torch.bfloat16 and can_pack() else None)

    def rates(self, repeats: int = 5) -> dict[str, float]:
        """GB/s per kernel, median of ``repeats``."""
        x, weight, packed = self.x, self.weight, self.packed
        out = {"torch": self.nbytes / median_ms(lambda: nn.functional.linear(x, weight), repeats) / 1e6}
        if packed is not None:
            out["packed"] = self.nbytes / median_ms(
                lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeats) / 1e6
        return out


def _ratios(times: list[float], limits: list[float]) -> list[float]:
    return [t / lim for t, lim in zip(times, limits, strict=True)]


def weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads from the weights: every linear layer (the output head included) once;
    embeddings give one row, norms are negligible."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if isinstance(m, nn.Linear))


def run_decode_bench(model: str, dtype: str = "bf16", threads: int | None = 1, new_tokens: int = 48,
                     repeats: int = 5, json_path: str | None = None) -> dict[str, Any]:
    from ssr_server.core.protocol import Context, GenerationParams
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.cpu_bf16 import use_packed
    from ssr_server.engine.torch.engine import TorchEngine
    from ssr_server.engine.torch.runner import Chunk

    if new_tokens < 2 or repeats < 1:
        raise ValueError("new_tokens must be >= 2 and repeats >= 1")
    # one forward per token: the speed-ups that save forwards are measured by ``bench actions``
    engine = TorchEngine(model, EngineConfig(dtype=dtype, threads=threads, jump_forward=False,
                                             prompt_lookup=False))
    try:
        runner, lm = engine.runner, engine.lm
        tok = engine.tokenizer
        ids = list(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True,
                                           add_generation_prompt=True, return_dict=False))
        p = runner.prepare(Context(tuple(ids)), reserve=new_tokens * (repeats + 2) * 4)
        runner.prefill([p])
        entry = runner.finish_prefill(p)
        kv = entry.kv.fork(extra=new_tokens * (repeats + 2) * 4)
        dims = 3 if lm.is_vl else 1
        start = kv.length

        def step() -> None:
            pos = torch.full((dims, 1), entry.next_pos + kv.length - start, dtype=torch.long,
                             device=lm.device)
            out = runner.forward([Chunk(kv, [ids[-1]], pos, [0], past_len=kv.length)])[0]
            if out.inplace:
                kv.length += 1
            else:
                kv.append(out.keys, out.values)

        def generate() -> float:
            params = GenerationParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            gen = asyncio.run(engine.generate(Context(tuple(ids)), params))
            return gen.elapsed_s * 1e3 / max(1, len(gen.token_ids))

        cfg = lm.text_config
        kv_bytes = (start * int(cfg.num_hidden_layers) * 2 * runner.kv_heads * runner.head_dim
                    * torch.tensor([], dtype=lm.dtype).element_size())
        wbytes = weight_bytes(lm.model)
        gemv = Gemv(wbytes, lm.dtype, int(cfg.hidden_size))
        kinds = ["packed", "plain"] if getattr(lm.model, "ssr_packed_linear_layers", 0) else ["as loaded"]
        fwd: dict[str, list[float]] = {k: [] for k in kinds}
        eng: dict[str, list[float]] = {k: [] for k in kinds}
        limits: list[float] = []
        rates: dict[str, list[float]] = {}
        # Rounds alternate the limit's gemv and every kind: a neighbour's load falls on all alike, and
        # each ratio to the limit is taken within its round.
        for _ in range(repeats):
            round_rates = gemv.rates()
            for k, v in round_rates.items():
                rates.setdefault(k, []).append(v)
            limits.append((wbytes + kv_bytes) / max(round_rates.values()) / 1e6)
            for kind in kinds:
                use_packed(lm.model, kind != "plain")
                fwd[kind].append(median_ms(step, 8))
                kv.length = start
                eng[kind].append(generate())
        use_packed(lm.model, True)
        del gemv
        tool_calls = _tool_calls(engine, EngineConfig(dtype=dtype, threads=threads))
        rows: list[dict[str, Any]] = []
        for k in kinds:
            rows.append({"kernel": k, "forward_ms": statistics.median(fwd[k]),
                         "engine_ms_per_token": statistics.median(eng[k]),
                         "forward_x_limit": statistics.median(_ratios(fwd[k], limits)),
                         "engine_x_limit": statistics.median(_ratios(eng[k], limits))})
        limit_ms = statistics.median(limits)
        result = {"bench": "decode", "model": engine.model_name, "dtype": dtype,
                  "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "context_tokens": start,
                  "new_tokens": new_tokens, "repeats": repeats, "weight_bytes": wbytes, "kv_bytes": kv_bytes,
                  "gemv_gb_s": {k: statistics.median(v) for k, v in rates.items()}, "limit_ms": limit_ms,
                  "rows": rows, "tool_calls": tool_calls,
                  # what the loaded model runs with (engine/torch/cpu_bf16.py, fast_layers.py)
                  "packed_linear_layers": getattr(lm.model, "ssr_packed_linear_layers", 0),
                  "fused_linear_layers": getattr(lm.model, "ssr_fused_linear_layers", 0),
                  "fast_layers": getattr(lm.model, "ssr_fast_layers", 0)}
    finally:
        asyncio.run(engine.close())
    if json_path:
        write_json(json_path, result)
    return result


def format_decode(r: dict[str, Any]) -> str:
    rates = ", ".join(f"{k} {v:.1f}" for k, v in r["gemv_gb_s"].items())
    lines = [f"decode: {r['model']} {r['dtype']}, {r['threads']} thread(s), context {r['context_tokens']} "
             f"tokens, {r['new_tokens']} new tokens, median of {r['repeats']} rounds",
             f"limit {r['limit_ms']:.2f} ms/token = ({r['weight_bytes'] / 1e6:.0f} MB weights + "
             f"{r['kv_bytes'] / 1e6:.1f} MB KV) / the fastest gemv (GB/s: {rates})",
             f"{'kernel':>10} {'forward ms':>11} {'x limit':>8} {'engine ms/token':>16} {'x limit':>8}",
             "-" * 58]
    for row in r["rows"]:
        lines.append(f"{row['kernel']:>10} {row['forward_ms']:>11.2f} {row['forward_x_limit']:>7.2f}x "
                     f"{row['engine_ms_per_token']:>16.2f} {row['engine_x_limit']:>7.2f}x")
    lines.append("forward: one decode step through ModelRunner.forward; engine: greedy generate, per token")
    lines.append(f"linear layers packed {r.get('packed_linear_layers', 0)} (of them fused siblings "
                 f"{r.get('fused_linear_layers', 0)}), decoder layers without module overhead "
                 f"{r.get('fast_layers', 0)}; 'plain' turns the packing off only")
    t = r.get("tool_calls")
    if t:
        lines.append(f"tool calls ({t['calls']} x get_weather, same text: {t['same_text']}): "
                     f"{t['tokens']} tokens in {t['forwards_off']} decode forwards without drafts, "
                     f"{t['forwards_on']} with "
                     f"({t['tokens_per_forward_on']:.2f} tokens per forward); ms per call "
                     f"{t['ms_off']:.0f} -> {t['ms_on']:.0f}")
    return "\n".join(lines)


CITIES = ("Paris", "Buenos Aires", "San Francisco", "Rio de Janeiro", "Kuala Lumpur", "Tokyo")
WEATHER = json.dumps({"type": "object", "additionalProperties": False, "required": ["city"],
                      "properties": {"city": {"type": "string", "maxLength": 40}}})


def _tool_calls(plain: Any, drafting_config: Any) -> dict[str, Any]:
    """A get_weather call per city, its arguments decoded under their JSON schema, on ``plain`` (one
    token per forward) and on an engine over the same weights with drafts (jump-forward and prompt
    lookup): the same text, and the decode forwards and time each took."""
    from ssr_server.core.protocol import Context, Generation, GenerationParams, Grammar
    from ssr_server.engine.torch.engine import TorchEngine

    tok = plain.tokenizer
    drafting = TorchEngine(plain.lm, drafting_config)
    params = GenerationParams(max_new_tokens=40, grammar=Grammar("json_schema", WEATHER))
    gens: dict[str, list[Generation]] = {"off": [], "on": []}
    try:
        for city in CITIES:
            text = tok.apply_chat_template(
                [{"role": "user", "content": f"What's the weather like in {city} today? Call get_weather."}],
                tokenize=False, add_generation_prompt=True)
            ctx = Context(tuple(tok.encode(text + '<tool_call>\n{"name": "get_weather", "arguments": ',
                                           add_special_tokens=False)))
            for name, engine in (("off", plain), ("on", drafting)):
                gens[name].append(asyncio.run(engine.generate(ctx, params)))
    finally:
        asyncio.run(drafting.close())
    off, on = gens["off"], gens["on"]
    tokens = sum(len(g.token_ids) for g in off)
    return {"calls": len(CITIES), "tokens": tokens,
            "same_text": all(a.text == b.text for a, b in zip(off, on, strict=True)),
            "forwards_off": sum(g.forwards for g in off), "forwards_on": sum(g.forwards for g in on),
            "tokens_per_forward_on": tokens / max(1, sum(g.forwards for g in on)),
            "ms_off": statistics.median(g.elapsed_s for g in off) * 1e3,
            "ms_on": statistics.median(g.elapsed_s for g in on) * 1e3}
