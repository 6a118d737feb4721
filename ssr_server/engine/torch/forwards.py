"""Instance-level forwards that replace a module's own and can be switched off and on again: how the
engine's CPU speed-ups (``cpu_bf16``'s packed weights, ``fast_layers``) change a loaded model without
subclassing it, and how tests and benchmarks compare each with transformers' own path on one model."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


def install(module: Any, attr: str, fn: Callable[..., Any]) -> None:
    """``fn`` bound to ``module`` becomes its forward, and is kept under ``attr`` (for ``switch``)."""
    bound = types.MethodType(fn, module)
    object.__setattr__(module, attr, bound)  # a plain attribute: not a submodule, not in state_dict
    module.forward = bound


def switch(model: Any, attr: str, on: bool) -> None:
    """Every forward installed under ``attr`` on (again), or off (the class's own forward)."""
    for module in model.modules():
        fwd = getattr(module, attr, None)
        if fwd is None:
            continue
        if on:
            module.forward = fwd
        else:
            module.__dict__.pop("forward", None)
