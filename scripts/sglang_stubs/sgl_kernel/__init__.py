"""A stand-in ``sgl_kernel`` for running SGLang on a CPU without AMX (test harness only).

No CPU build of sgl_kernel is on PyPI. On such a CPU SGLang uses plain-torch fallbacks, but it still
imports names from ``sgl_kernel`` and reads a few ``torch.ops.sgl_kernel`` ops at import time.

- ``from sgl_kernel import X`` succeeds and gives a function that raises if it is ever called.
- The ops SGLang reads at import time are *defined* (schema only, no kernel) in a FRAGMENT library.
- Nothing else is added to ``torch.ops.sgl_kernel``: capability probes such as
  ``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`` must stay False, or SGLang believes
  fused kernels exist.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__version__ = "0.0.0+cpu-stub"

_OPS = (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_gdn_gating_cpu",
    "fused_sigmoid_gating_delta_rule_update_cpu",
    "fused_moe_router_cpu",
    "rmsnorm_cpu",
    "fused_dual_residual_rmsnorm_cpu",
)

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
for _name in _OPS:
    if not hasattr(torch.ops.sgl_kernel, _name):
        _LIB.define(f"{_name}(Tensor[] args) -> Tensor")


def _stub(name: str) -> Any:
    def _missing(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is a CPU stand-in (scripts/sglang_stubs); a real kernel was requested"
        )

    _missing.__name__ = name
    _missing.__qualname__ = name
    return _missing


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    fn = _stub(name)
    globals()[name] = fn
    return fn
