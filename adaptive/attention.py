"""Attention kernels for the U-Net's self-attention blocks, and the rule that picks one per device and precision.

Same math every way (softmax(q k^T / sqrt(d)) v, Vaswani et al. 2017, eq. 1); only the kernel and its precision change.
Measured by benchmarks/attention_kernels.py (docs/benchmarks/throughput/ holds the latest run).
"""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

# On the CPU, score matrices (batch x heads, L x L) up to this many bytes in all are computed in one go, and the
# probabilities are kept for the backward: cpu-tiny16's 64-token blocks (8 MiB at batch 128; 16 MiB when sampling at
# batch 256).
UNBLOCKED_SCORE_BYTES = 16 * 2**20
# Above it, `matmul_attention` runs over groups of matrices that fill this many bytes per thread (about one core's L2
# cache), and the backward recomputes each group's probabilities instead of reading them back from memory.
BLOCK_SCORE_BYTES_PER_THREAD = 2**20


@torch.compiler.assume_constant_result
def _threads() -> int:
    """torch's intra-op thread count (a constant to torch.compile, which would otherwise break its graph here)."""
    return torch.get_num_threads()


def attention_group(n: int, q_len: int, k_len: int, itemsize: int, threads: int | None = None) -> int:
    """How many of n score matrices `matmul_attention` takes at once: all of them up to UNBLOCKED_SCORE_BYTES, else
    as many as fill BLOCK_SCORE_BYTES_PER_THREAD per thread (at least one per thread)."""
    per = q_len * k_len * itemsize
    if n * per <= UNBLOCKED_SCORE_BYTES:
        return n
    threads = threads or _threads()
    return min(n, max(threads, threads * BLOCK_SCORE_BYTES_PER_THREAD // per))


def _group_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One group of (n, L, d) heads: the scaled queries and softmax(q k^T scale). PyTorch's softmax accumulates bf16
    input in fp32, so in bf16 this equals Diffusers' upcast softmax rounded to bf16 (tested) without two casts."""
    qs = q * scale
    return qs, torch.bmm(qs, k.transpose(1, 2)).softmax(-1)


def _blocked_forward(q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, scale: float, group: int) -> torch.Tensor:
    """Attention over (n, L, d) heads, `group` heads at a time."""
    return torch.cat([torch.bmm(_group_probs(q3[i:i + group], k3[i:i + group], scale)[1], v3[i:i + group])
                      for i in range(0, q3.shape[0], group)])


# The blocked kernel is one opaque operator (forward and backward), so torch.compile calls it as it is instead of
# unrolling its loop over groups into one graph (slower, and minutes of compilation).
@torch.library.custom_op("adaptive::blocked_attention", mutates_args=())
def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, group: int) -> torch.Tensor:
    """`matmul_attention` over groups of `group` heads whose scores stay in the cache, in q's dtype."""
    with torch.autocast(q.device.type, enabled=False):
        q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
        return _blocked_forward(q3, k3, v3, scale, group).view(*q.shape[:-1], v.shape[-1])


@torch.library.custom_op("adaptive::blocked_attention_backward", mutates_args=())
def blocked_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                               group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `blocked_attention` with each group's probabilities recomputed (as flash attention does, Dao et
    al. 2022, sec. 3.1), so that the forward keeps only q, k and v."""
    with torch.autocast(q.device.type, enabled=False):
        q3, k3, v3, g3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v, grad_out))
        dq, dk, dv = [], [], []
        for i in range(0, q3.shape[0], group):
            qg, kg, vg, gg = (t[i:i + group] for t in (q3, k3, v3, g3))
            qs, probs = _group_probs(qg, kg, scale)
            dv.append(torch.bmm(probs.transpose(1, 2), gg))
            dscores = torch._softmax_backward_data(torch.bmm(gg, vg.transpose(1, 2)), probs, -1, probs.dtype)
            dq.append(torch.bmm(dscores, kg) * scale)
            dk.append(torch.bmm(dscores.transpose(1, 2), qs))
        return torch.cat(dq).view(q.shape), torch.cat(dk).view(k.shape), torch.cat(dv).view(v.shape)


@blocked_attention.register_fake
def _(q, k, v, scale, group):
    return q.new_empty(*q.shape[:-1], v.shape[-1])


@blocked_attention_backward.register_fake
def _(grad_out, q, k, v, scale, group):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save_inputs(ctx, inputs, output):
    q, k, v, ctx.scale, ctx.group = inputs
    ctx.save_for_backward(q, k, v)


def _backward(ctx, grad_out):
    return (*blocked_attention_backward(grad_out, *ctx.saved_tensors, ctx.scale, ctx.group), None, None)


blocked_attention.register_autograd(_backward, setup_context=_save_inputs)


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     group: int | None = None) -> torch.Tensor:
    """softmax(q k^T scale) v over (B, heads, L, d) as matmuls and a softmax in the input dtype (Vaswani et al. 2017,
    eq. 1), over groups of `group` heads (default on the CPU: `attention_group`; elsewhere all at once) when all the
    scores would not fit the cache."""
    n = q.shape[:-2].numel()
    if group is None:
        group = attention_group(n, q.shape[-2], k.shape[-2], q.element_size()) if q.device.type == "cpu" else n
    if group >= n:
        probs = torch.matmul(q * scale, k.transpose(-1, -2)).softmax(-1)
        return torch.matmul(probs, v)
    return blocked_attention(q, k, v, scale, group)


class MatmulAttnProcessor(AttnProcessor2_0):
    """Self-attention of the U-Net's blocks with `matmul_attention` in place of SDPA (the parent handles every other
    case: masks, cross-attention, spatial or q/k norms)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        if (encoder_hidden_states is not None or attention_mask is not None or attn.spatial_norm is not None
                or attn.norm_q is not None or attn.norm_k is not None or hidden_states.ndim != 4):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        residual = hidden_states
        b, c, h, w = hidden_states.shape
        x = hidden_states.view(b, c, h * w)
        x = (attn.group_norm(x) if attn.group_norm is not None else x).transpose(1, 2)
        heads = lambda y: y.view(b, h * w, attn.heads, -1).transpose(1, 2)  # noqa: E731
        out = matmul_attention(heads(attn.to_q(x)), heads(attn.to_k(x)), heads(attn.to_v(x)), attn.scale)
        out = attn.to_out[1](attn.to_out[0](out.transpose(1, 2).reshape(b, h * w, -1)))
        out = out.transpose(1, 2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


class CpuAttnProcessor(MatmulAttnProcessor):
    """`matmul_attention` under CPU bf16 autocast (training and sampling), SDPA otherwise."""

    # The parent's named parameters, spelled out: Attention.forward inspects this signature and warns (every call)
    # about, then drops, any keyword it does not name - e.g. the U-Net's temb.
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        kwargs.update(encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, temb=temb)
        if hidden_states.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            return super().__call__(attn, hidden_states, *args, **kwargs)
        return AttnProcessor2_0.__call__(self, attn, hidden_states, *args, **kwargs)


def configure_attention(unet, impl: str = "auto", device_type: str = "cpu"):
    """Pick the attention kernel: 'sdpa' (torch scaled_dot_product_attention, Diffusers' default), 'classic'
    (Diffusers' AttnProcessor: baddbmm + softmax), 'matmul' (`matmul_attention`: bf16 matmuls and softmax, over
    cache-sized groups of heads when the scores are large) or 'auto' = `matmul_attention` on the CPU under bf16
    autocast (2-6x faster than bf16 SDPA there, whose CPU kernels are slow for 8-channel heads), SDPA otherwise (fp32
    on the CPU, where SDPA is as fast; flash / memory-efficient kernels on CUDA). Returns the U-Net.
    """
    if impl == "auto":
        proc = CpuAttnProcessor() if device_type == "cpu" else AttnProcessor2_0()
    else:
        proc = {"classic": AttnProcessor, "matmul": MatmulAttnProcessor}.get(impl, AttnProcessor2_0)()
    for module in unet.modules():
        if isinstance(module, Attention):
            module.set_processor(proc)
    return unet
