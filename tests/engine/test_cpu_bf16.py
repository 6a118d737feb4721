"""bf16 matmuls through the fp32 kernel: same arithmetic as a bf16 GEMM with fp32 accumulation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ssr_server.engine.torch.cpu_bf16 import has_native_bf16, install_fp32_matmul
from ssr_server.engine.torch.loader import configure_bf16_matmul


def test_cpu_flags_are_read() -> None:
    assert has_native_bf16("flags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n")
    assert has_native_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not has_native_bf16("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n")
    assert has_native_bf16("no flags line here")  # cannot tell: change nothing


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32, bias=False)).to(torch.bfloat16)


def test_fp32_kernel_matches_native_bf16_and_keeps_dtypes() -> None:
    native, fast = _model(), _model()
    assert install_fp32_matmul(fast, min_rows=8) == 2
    for rows in (1, 8, 40):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        a, b = native(x), fast(x)
        assert b.dtype == torch.bfloat16 and b.shape == a.shape
        # both accumulate in fp32 and round to bf16: equal up to accumulation order
        torch.testing.assert_close(b.float(), a.float(), atol=2e-2, rtol=2e-2)
    # exactly the upcast product for multi-row inputs, the native one for single rows
    x = torch.randn(40, 96).to(torch.bfloat16)
    lin = fast[2]
    want = torch.nn.functional.linear(x.float(), lin.weight.float()).to(torch.bfloat16)
    assert torch.equal(lin(x), want)
    one = x[:1]
    assert torch.equal(lin(one), torch.nn.functional.linear(one, lin.weight))
    assert all(p.dtype == torch.bfloat16 for p in fast.parameters())


def test_configure_only_acts_on_bf16_cpu() -> None:
    m = _model()
    assert not configure_bf16_matmul(m, torch.float32, torch.device("cpu"), "fp32")
    assert not configure_bf16_matmul(m, torch.bfloat16, torch.device("cpu"), "native")
    assert configure_bf16_matmul(m, torch.bfloat16, torch.device("cpu"), "fp32")
    assert m.ssr_fp32_matmul_layers == 2  # type: ignore[attr-defined]


def test_an_exact_engine_keeps_one_kernel_on_a_cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact drafts need a draft row and a one-token step to take the same kernel: on a CPU without bf16
    arithmetic ``auto`` then leaves PyTorch's bf16 kernel at every row count (tests/realmodel checks the
    bits); without exact drafts it routes multi-row products through fp32."""
    from ssr_server.engine.torch import cpu_bf16

    monkeypatch.setattr(cpu_bf16, "has_native_bf16", lambda cpuinfo=None: False)
    exact, plain = _model(), _model()
    assert not configure_bf16_matmul(exact, torch.bfloat16, torch.device("cpu"), "auto", exact=True)
    assert cpu_bf16.fp32_rows(exact[0]) is None
    assert configure_bf16_matmul(plain, torch.bfloat16, torch.device("cpu"), "auto")
    assert cpu_bf16.fp32_rows(plain[0]) == 8
    forced = _model()  # an explicit choice stands
    assert configure_bf16_matmul(forced, torch.bfloat16, torch.device("cpu"), "fp32", exact=True)


def test_packed_weights_give_the_native_kernels_results() -> None:
    """oneDNN-packed weights: the same kernel as PyTorch's bf16 linear without its per-call weight
    reorder, so bit for bit the same results where that kernel is oneDNN's (CPUs with bf16)."""
    from ssr_server.engine.torch.cpu_bf16 import can_pack, install_packed_linear

    assert torch.backends.mkldnn.is_available()  # the CPU wheel the project installs has oneDNN
    native, packed = _model(), _model()
    if not can_pack():  # a CPU oneDNN's bf16 path cannot run on (AVX only): nothing installed, no error
        x = torch.randn(3, 64).to(torch.bfloat16)
        assert install_packed_linear(packed) == 0 and packed.ssr_packed_linear_layers == 0  # type: ignore[attr-defined]
        assert torch.equal(packed(x), native(x))
        with pytest.raises(RuntimeError, match="bf16"):
            torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=torch.bfloat16), 1)
        return
    assert install_packed_linear(packed) == 2 and packed.ssr_packed_linear_layers == 2  # type: ignore[attr-defined]
    assert packed.state_dict().keys() == native.state_dict().keys()  # the packed copy is not a buffer
    for shape in ((1, 64), (1, 1, 64), (1, 3, 64), (8, 64), (1, 40, 64)):
        x = torch.randn(shape).to(torch.bfloat16)
        a, b = native(x), packed(x)
        assert b.dtype == torch.bfloat16 and b.shape == a.shape
        if has_native_bf16():
            assert torch.equal(a, b), shape
        else:
            torch.testing.assert_close(b.float(), a.float(), atol=2e-2, rtol=2e-2)
    m = _model()
    assert configure_bf16_matmul(m, torch.bfloat16, torch.device("cpu"), "auto")
    assert getattr(m, "ssr_packed_linear_layers", 0) == (2 if has_native_bf16() else 0)


class _Block(nn.Module):
    """The shape of a decoder layer's projections: q/k/v read one input, gate/up another."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, n, bias=bias) for n in (64, 16, 16))
        self.o_proj = nn.Linear(64, 64, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(64, 128, bias=False), nn.Linear(64, 128, bias=False)
        self.down_proj = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = x + self.o_proj(q * torch.cat([k, v, k, v], dim=-1))
        out: torch.Tensor = h + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
        return out


def test_sibling_projections_share_one_packed_weight_with_the_same_results(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v and gate/up packed as one weight each: one product instead of three and two, the same
    bits as each projection alone (and as PyTorch's own kernel on CPUs with bf16); a sibling called
    with another input than the first one's multiplies by itself."""
    from ssr_server.engine.torch import cpu_bf16
    from ssr_server.engine.torch.cpu_bf16 import can_pack, install_packed_linear, use_packed

    calls: list[int] = []
    real = cpu_bf16._linear
    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(cpu_bf16, "_linear", counted)

    for bias in (False, True):
        torch.manual_seed(0)
        native = _Block(bias).to(torch.bfloat16)
        fused = _Block(bias).to(torch.bfloat16)
        fused.load_state_dict(native.state_dict())
        if not can_pack():  # see the test above: nothing to compare on this CPU but the fallback
            assert install_packed_linear(fused) == 0
            x = torch.randn(1, 9, 64).to(torch.bfloat16)
            assert torch.equal(fused(x), native(x))
            continue
        assert install_packed_linear(fused) == 7 and fused.ssr_fused_linear_layers == 5  # type: ignore[attr-defined]
        for shape in ((1, 1, 64), (1, 9, 64), (40, 64)):
            x = torch.randn(shape).to(torch.bfloat16)
            a = native(x)
            calls.clear()
            b = fused(x)
            assert len(calls) == 4  # qkv, o, gate+up, down
            if has_native_bf16():
                assert torch.equal(a, b), (bias, shape)
            else:
                torch.testing.assert_close(b.float(), a.float(), atol=5e-2, rtol=5e-2)
            use_packed(fused, False)  # PyTorch's kernel on the plain weights, then packed again
            torch.testing.assert_close(fused(x).float(), a.float(), atol=0, rtol=0)
            use_packed(fused, True)
        x, y = torch.randn(1, 64).to(torch.bfloat16), torch.randn(1, 64).to(torch.bfloat16)
        fused.q_proj(x)
        assert torch.equal(fused.k_proj(y), native.k_proj(y))  # another input: its own product
        v = fused.v_proj(x)  # the first one's input: its slice of the shared product
        assert v.shape == (1, 16) and (torch.equal(v, native.v_proj(x)) or not has_native_bf16())
