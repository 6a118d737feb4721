"""bf16 matrix products through the fp32 kernel on CPUs without native bf16 arithmetic.

On a CPU without ``avx512_bf16``/``amx_bf16`` PyTorch's bf16 GEMM is emulated: measured here at 61
GFLOP/s against 277 in fp32 (Xeon, 2 cores). Multi-token forwards (prefill, packed candidate
scoring) are compute-bound, so they pay that 4.5x; single-token decoding is bandwidth-bound and does
not (a 1024x3072 layer: 1 row 0.29 ms bf16 vs 0.73 ms upcast; 8 rows 1.5 vs 1.2; 162 rows 16.9 vs
4.4). For forwards of at least ``min_rows`` rows, each ``nn.Linear`` therefore upcasts its bf16 input and
weight (exactly: bf16 is a truncated fp32), multiplies in fp32 and rounds the result to bf16 - the
same arithmetic as a bf16 GEMM with fp32 accumulation, through the fast kernel. Weights, activations
and the KV cache stay bf16; decoding keeps the native path.
"""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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
