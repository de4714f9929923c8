"""adaptive/model.py: the attention-kernel choice keeps the math; only the kernel and its precision change."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention

from adaptive.model import CPU_MATMUL_ATTENTION_MAX_TOKENS, attention_tokens, configure_attention


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
def test_auto_attention_on_the_cpu_is_sdpa_with_short_sequences_through_matmul_while_training(side):
    torch.manual_seed(0)
    m = Holder(32)
    x = torch.randn(4, 32, side, side, requires_grad=True)
    assert attention_tokens(x) == side * side and attention_tokens(x.flatten(2).transpose(1, 2)) == side * side
    auto = run(m, "auto", x, autocast=True)
    if side * side <= CPU_MATMUL_ATTENTION_MAX_TOKENS:
        # exactly the matmul kernel under the same autocast, and close to SDPA in fp32
        assert torch.equal(auto, run(m, "matmul", x, autocast=True))
        assert not torch.equal(auto, run(m, "sdpa", x, autocast=True))
        torch.testing.assert_close(auto.float(), run(m, "sdpa", x, autocast=False), atol=0.05, rtol=0.05)
    else:
        assert torch.equal(auto, run(m, "sdpa", x, autocast=True))
    # classic, sdpa and auto are the same attention up to precision
    ref = run(m, "classic", x, autocast=False)
    for impl in ("sdpa", "auto", "matmul"):
        torch.testing.assert_close(run(m, impl, x, autocast=False), ref, atol=1e-5, rtol=1e-5)
    auto.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # without gradients (sampling) the same rule
    with torch.no_grad():
        short = side * side <= CPU_MATMUL_ATTENTION_MAX_TOKENS
        assert torch.equal(run(m, "auto", x, autocast=True), run(m, "matmul" if short else "sdpa", x, autocast=True))


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
