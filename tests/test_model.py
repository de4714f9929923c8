"""adaptive/attention.py: the attention-kernel choice keeps the math; only the kernel and its precision change."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention

from adaptive.attention import (BLOCK_SCORE_BYTES_PER_THREAD, UNBLOCKED_SCORE_BYTES, attention_group,
                                blocked_attention, configure_attention, matmul_attention)


class Holder(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.attn = Attention(channels, heads=channels // 8, dim_head=8, rescale_output_factor=1.0, eps=1e-5,
                              norm_num_groups=8, residual_connection=True, bias=True, upcast_softmax=True,
                              _from_deprecated_attn_block=True)


def run(module: Holder, impl: str, x: torch.Tensor, autocast: bool) -> torch.Tensor:
    configure_attention(module, impl, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return module.attn(x)


@pytest.mark.parametrize("side", [8, 16])
def test_auto_attention_on_the_cpu_is_the_matmul_kernel_under_bf16_autocast_and_sdpa_in_fp32(side):
    torch.manual_seed(0)
    m = Holder(32)
    x = torch.randn(4, 32, side, side, requires_grad=True)
    auto = run(m, "auto", x, autocast=True)
    # exactly the matmul kernel under the same autocast, and close to SDPA in fp32
    assert torch.equal(auto, run(m, "matmul", x, autocast=True))
    assert not torch.equal(auto, run(m, "sdpa", x, autocast=True))
    torch.testing.assert_close(auto.float(), run(m, "sdpa", x, autocast=False), atol=0.05, rtol=0.05)
    # without autocast it is SDPA
    assert torch.equal(run(m, "auto", x, autocast=False), run(m, "sdpa", x, autocast=False))
    # classic, sdpa, matmul and auto are the same attention up to precision
    ref = run(m, "classic", x, autocast=False)
    for impl in ("sdpa", "auto", "matmul"):
        torch.testing.assert_close(run(m, impl, x, autocast=False), ref, atol=1e-5, rtol=1e-5)
    auto.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # without gradients (sampling) the same rule
    with torch.no_grad():
        assert torch.equal(run(m, "auto", x, autocast=True), run(m, "matmul", x, autocast=True))


def heads(dtype, n=(3, 4), length=64, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    # (B, heads, L, d) views with the processor's strides: (B, L, heads, d) transposed
    return [torch.randn(n[0], length, n[1], dim, generator=g, dtype=dtype).transpose(1, 2).requires_grad_()
            for _ in range(3)]


def attention_and_grads(q, k, v, group):
    out = matmul_attention(q, k, v, 8**-0.5, group=group)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return [out.detach(), *grads]


@pytest.mark.parametrize("group", [1, 5, 11])
def test_blocked_matmul_attention_is_the_unblocked_kernel_forward_and_backward(group):
    """Groups of heads with recomputed probabilities: bit-identical in bf16 (the same kernels per head), fp32 to
    rounding; without gradients too."""
    q, k, v = heads(torch.bfloat16)
    whole = attention_and_grads(q, k, v, group=12)
    for a, b in zip(whole, attention_and_grads(q, k, v, group=group)):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(matmul_attention(q, k, v, 8**-0.5, group=group), whole[0])
    q, k, v = heads(torch.float32)
    for a, b in zip(attention_and_grads(q, k, v, group=12), attention_and_grads(q, k, v, group=group)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_blocked_matmul_attention_keeps_no_score_matrix_for_the_backward():
    q, k, v = heads(torch.bfloat16, length=64)
    for group, keeps_scores in ((12, True), (4, False)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            matmul_attention(q, k, v, 8**-0.5, group=group)
        assert (max(saved) >= 12 * 64 * 64) == keeps_scores


def test_attention_group_fills_the_cache_budget_per_thread():
    per = 256 * 256 * 2
    assert attention_group(1024, 64, 64, 2, threads=2) == 1024  # 8 MiB of scores: one go
    for threads in (1, 2, 16):
        group = attention_group(1024, 256, 256, 2, threads=threads)
        assert group >= threads and group * per <= threads * BLOCK_SCORE_BYTES_PER_THREAD
        assert (group + 1) * per > threads * BLOCK_SCORE_BYTES_PER_THREAD
    assert attention_group(8, 4096, 4096, 4, threads=2) == 2  # a matrix larger than the budget: one per thread
    assert attention_group(n=(UNBLOCKED_SCORE_BYTES // per) + 1, q_len=256, k_len=256, itemsize=2, threads=2) == 16


def test_matmul_attention_is_sdpa_in_fp32_forward_and_backward():
    torch.manual_seed(0)
    m = Holder(32)
    x = torch.randn(4, 32, 8, 8, requires_grad=True)
    grads = {}
    for impl in ("sdpa", "matmul"):
        y = run(m, impl, x, autocast=False)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads[impl] = (y.detach(), x.grad.clone(), *(p.grad.clone() for p in m.parameters()))
        x.grad = None
        m.zero_grad()
    for a, b in zip(grads["sdpa"], grads["matmul"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # under bf16 autocast: bf16 matmuls and softmax - close to the fp32 result, not equal
    torch.testing.assert_close(run(m, "matmul", x, autocast=True).float(), grads["sdpa"][0], atol=0.05, rtol=0.05)


def test_bf16_softmax_of_the_matmul_kernel_is_the_upcast_softmax_rounded():
    """matmul_attention skips Diffusers' upcast: valid only while softmax accumulates bf16 input in fp32."""
    scores = (torch.randn(4, 8, 64, 64, generator=torch.Generator().manual_seed(0)) * 4).bfloat16()
    assert torch.equal(scores.softmax(-1), scores.float().softmax(-1).bfloat16())


@pytest.mark.parametrize("impl", ["auto", "sdpa", "classic", "matmul"])
def test_every_attention_kernel_takes_the_unets_arguments_without_warnings(impl, monkeypatch):
    # Attention.forward warns on every call about keywords the processor's signature does not name (and drops them)
    import diffusers.models.attention_processor as ap
    from diffusers import UNet2DModel

    warned = []
    monkeypatch.setattr(ap.logger, "warning", lambda msg, *a, **k: warned.append(msg))
    unet = UNet2DModel(sample_size=8, block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=8,
                       attention_head_dim=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    configure_attention(unet, impl, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        unet(torch.randn(2, 3, 8, 8), torch.tensor([1, 500])).sample.float().sum().backward()
    assert warned == []


def test_blocked_attention_is_a_well_formed_operator_for_torch_compile():
    """torch.library's checks of the custom operator (schema, fake tensors, autograd registration), which
    torch.compile relies on to call it as it is."""
    for dtype in (torch.bfloat16, torch.float32):
        torch.library.opcheck(blocked_attention, (*heads(dtype, length=16), 8**-0.5, 5))


def test_compiled_attention_block_calls_the_blocked_operator_and_matches_eager(monkeypatch):
    import adaptive.attention as attention

    monkeypatch.setattr(attention, "UNBLOCKED_SCORE_BYTES", 0)  # groups even for this small block
    monkeypatch.setattr(attention, "BLOCK_SCORE_BYTES_PER_THREAD", 64 * 64 * 2)
    torch.manual_seed(0)
    m = Holder(32)
    configure_attention(m, "auto", "cpu")
    x = torch.randn(4, 32, 8, 8)
    calls = []
    monkeypatch.setattr(attention, "_blocked_forward",
                        lambda *a, f=attention._blocked_forward: calls.append(a[-1]) or f(*a))
    results = []
    for fn in (m.attn, torch.compile(m.attn, fullgraph=True)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(xi)
        y.float().square().sum().backward()
        results.append((y.float().detach(), xi.grad))
    assert calls and all(g < 4 * 4 for g in calls)  # the operator ran with its groups, eager and compiled
    # and torch.compile sees it as one node, not as the matmuls and softmaxes of its loop
    targets = []

    def record(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.compile(m.attn, backend=record, fullgraph=True)(x)
    assert "adaptive.blocked_attention.default" in targets and not any("softmax" in t for t in targets)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.05)
