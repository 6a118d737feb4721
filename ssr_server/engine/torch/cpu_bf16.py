"""bf16 matrix products through the fp32 kernel on CPUs without native bf16 arithmetic.

On a CPU without ``avx512_bf16``/``amx_bf16`` PyTorch's bf16 GEMM is emulated: measured here at 61
GFLOP/s against 277 in fp32 (Xeon, 2 cores). Multi-token forwards (prefill, packed candidate
scoring) are compute-bound, so they pay that 4.5x; single-token decoding is bandwidth-bound and does
not (a 1024x3072 layer: 1 row 0.29 ms bf16 vs 0.73 ms upcast; 8 rows 1.5 vs 1.2; 162 rows 16.9 vs
4.4). For forwards of at least ``min_rows`` rows, each ``nn.Linear`` therefore upcasts its bf16 input and
weight (exactly: bf16 is a truncated fp32), multiplies in fp32 and rounds the result to bf16 - the
same arithmetic as a bf16 GEMM with fp32 accumulation, through the fast kernel. Weights, activations
and the KV cache stay bf16; decoding keeps the native path.

On a CPU *with* bf16 arithmetic the native kernel is the right one, but PyTorch hands oneDNN the plain
``(out, in)`` weight on every call and oneDNN reorders it into its blocked layout each time: for a
decode step (one row per sequence) that reorder reads and writes the whole weight again, so a bf16
gemv ran at a third of the memory bandwidth (SmolLM2-135M: 50 ms per decode step, of which 86% in
``aten::mm``). ``install_packed_linear`` reorders each bf16 weight once, at load time
(``mkldnn._reorder_linear_weight``, what inductor's CPU freezing does), and multiplies with the packed
copy (``mkldnn._linear_pointwise``): the same kernel and the same results, bit for bit, at every row
count, without the per-call reorder. It costs a second copy of the linear weights in memory.

Projections that read the same input one after the other (an attention's q, k and v; an MLP's gate and
up) are packed as ONE weight, their rows stacked: a decode step then makes 4 matrix products per layer
instead of 7 (SmolLM2-135M: 121 instead of 211 calls, ~2 ms of a ~36 ms step, measured). Each output
element is still the same row's dot product with the same input, so the results are the same bits
(tests check it). The first projection called computes all of them and hands each sibling its slice
for that very input tensor; a sibling called with another input (no model here does) multiplies by
itself, with the plain weight.
"""

from __future__ import annotations

import functools
import logging
import threading
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ssr_server.engine.torch import forwards

log = logging.getLogger(__name__)


def has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has bf16 arithmetic (or when we cannot tell: then nothing is changed)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), None)
    if flags is None:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _forward(self: nn.Linear, x: torch.Tensor, min_rows: int) -> torch.Tensor:
    if x.dtype == torch.bfloat16 and x.numel() >= min_rows * x.shape[-1]:
        bias = self.bias.float() if self.bias is not None else None
        return F.linear(x.float(), self.weight.float(), bias).to(torch.bfloat16)
    return F.linear(x, self.weight, self.bias)


def fp32_rows(module: nn.Module) -> int | None:
    """The row count from which ``module`` multiplies in fp32 (None: it is not routed)."""
    rows = getattr(module, "ssr_fp32_min_rows", None)
    return int(rows) if rows is not None else None


def install_fp32_matmul(model: Any, min_rows: int = 8) -> int:
    """Route every bf16 ``nn.Linear`` of ``model`` through the fp32 kernel for >= ``min_rows`` rows."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype == torch.bfloat16:
            module.forward = types.MethodType(  # type: ignore[method-assign]
                lambda self, x, _r=min_rows: _forward(self, x, _r), module)
            setattr(module, "ssr_fp32_min_rows", min_rows)  # noqa: B010 (for code that multiplies by the weight itself)
            count += 1
    model.ssr_fp32_matmul_layers = count  # visible to benchmarks and logs
    return count


@functools.cache
def can_pack() -> bool:
    """Whether oneDNN's packed bf16 linear runs here: the PyTorch build has it (CPU builds with mkldnn
    do) and the CPU can run it (oneDNN's bf16 path needs avx512bw/vl/dq or avx_ne_convert: on an
    AVX-only EPYC VM the reorder raises), tried once on a small weight."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        with torch.no_grad():
            packed = ops._reorder_linear_weight(torch.ones(8, 8, dtype=torch.bfloat16), 1)
            _linear(torch.ones(1, 8, dtype=torch.bfloat16), packed, None)
    except RuntimeError as exc:
        log.info("oneDNN's packed bf16 linear does not run on this CPU: %s", exc)
        return False
    return True


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed: torch.Tensor = self.ssr_packed_weight  # type: ignore[assignment]
    if x.dtype != torch.bfloat16:  # not ours to change (e.g. a caller that upcast the input)
        return F.linear(x, self.weight, self.bias)
    return _linear(x, packed, self.bias)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # type: ignore[no-any-return]


PACKED = "ssr_packed_forward"  # where a module's packed forward is kept (forwards.install)
# Sibling projections (see the module's docstring): names in the order the models call them.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Fused:
    """One packed weight for sibling projections, and the slices of the last input it multiplied."""

    def __init__(self, parts: list[nn.Linear]) -> None:
        weight = torch.cat([m.weight.detach() for m in parts])
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        biases = [m.bias for m in parts]
        self.bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        self.sizes = [m.out_features for m in parts]
        self._local = threading.local()  # per thread: the input and the slices not yet taken

    def first(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            return F.linear(x, module.weight, module.bias)
        out: list[torch.Tensor] = [o.contiguous() for o in torch.split(_linear(x, self.packed, self.bias),
                                                                         self.sizes, dim=-1)]
        self._local.x, self._local.rest = x, out[1:]
        return out[0]

    def sibling(self, module: nn.Linear, x: torch.Tensor, i: int) -> torch.Tensor:
        rest: list[torch.Tensor | None] | None = getattr(self._local, "rest", None)
        if rest is not None and self._local.x is x and rest[i - 1] is not None:
            out = rest[i - 1]
            rest[i - 1] = None
            if all(r is None for r in rest):
                self._local.x = self._local.rest = None  # nothing of this input is kept past its use
            assert out is not None
            return out
        return F.linear(x, module.weight, module.bias)


def _fuse(model: Any) -> int:
    """Fuse the sibling projections of every module that has them all as packable bf16 linears with the
    same input size and all or none with a bias; how many projections were fused."""
    count = 0
    for parent in model.modules():
        for names in SIBLINGS:
            parts = [getattr(parent, n, None) for n in names]
            if not all(_packable(m) for m in parts):
                continue
            linears = [m for m in parts if isinstance(m, nn.Linear)]
            if len({m.in_features for m in linears}) != 1 or len({m.bias is None for m in linears}) != 1:
                continue
            fused = _Fused(linears)
            for i, m in enumerate(linears):
                forwards.install(m, PACKED, (lambda self, x, _f=fused: _f.first(self, x)) if i == 0 else
                                 (lambda self, x, _f=fused, _i=i: _f.sibling(self, x, _i)))
            count += len(linears)
    return count


def _packable(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, nn.Linear) and weight is not None and weight.dtype == torch.bfloat16 \
        and weight.device.type == "cpu"


def install_packed_linear(model: Any) -> int:
    """Give every bf16 CPU ``nn.Linear`` of ``model`` a oneDNN-packed copy of its weight, used by its
    forward, sibling projections one copy for all (see the module's docstring). The plain weight stays:
    code that reads it (the output head's blockwise log-probabilities, a tied embedding) is unchanged.
    Where oneDNN's packed bf16 linear cannot run (``can_pack``), nothing is installed: 0."""
    if not can_pack():
        model.ssr_packed_linear_layers = model.ssr_fused_linear_layers = 0
        return 0
    fused = _fuse(model)
    count = fused
    for module in model.modules():
        if not _packable(module) or getattr(module, PACKED, None) is not None:
            continue
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), 1)
        # a plain attribute, not a buffer: state_dict, .to() and parameter counts do not see it
        object.__setattr__(module, "ssr_packed_weight", packed)
        forwards.install(module, PACKED, _packed_forward)
        count += 1
    model.ssr_packed_linear_layers = count  # visible to benchmarks and logs
    model.ssr_fused_linear_layers = fused
    return count


def use_packed(model: Any, on: bool) -> None:
    """Switch the packed weights installed by ``install_packed_linear`` off (PyTorch's kernel on the
    plain weight) or on again: benchmarks and tests compare the two on one loaded model."""
    forwards.switch(model, PACKED, on)
