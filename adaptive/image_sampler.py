"""The image sampler: DDPM ancestral sampling with one seed per image, shared by training previews, sample.py and
evaluation (not to be confused with the timestep sampler, adaptive/timesteps/).

Image i is generated from its own torch.Generator(seed_i): its initial noise and every step's noise come from that
generator alone, so the images do not depend on the batch size or on how many processes share the work.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [-1, 1] -> uint8 [B, H, W, 3] (as DDPMPipeline + numpy_to_pil: round(255 * (x/2 + 1/2)))."""
    return ((x.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)


def make_scheduler(config, kind: str = "ddpm"):
    """A fresh scheduler (set_timesteps mutates state) from a DDPMScheduler config; kind 'ddpm' or 'ddim'."""
    cls = {"ddpm": DDPMScheduler, "ddim": DDIMScheduler}[kind]
    return cls.from_config(config)


@torch.no_grad()
def ddpm_step(sched, model_output: torch.Tensor, t: torch.Tensor, prev_t: int, sample: torch.Tensor,
              noise: Optional[torch.Tensor]) -> torch.Tensor:
    """x_{t-1} from x_t: DDPM ancestral step (Ho et al. 2020, eq. 7 and Algorithm 2) on a respaced schedule.

    The same arithmetic, in the same order, as DDPMScheduler.step for variance_type 'fixed_small' (bit-identical
    results), but the noise is passed in, so no per-step host-to-device copy of CPU-generated noise is needed. Kept
    instead of DDPMScheduler.step: identical images, 2-3% less CPU time per sampling run (docs/benchmarks/library/).
    """
    acp = sched.alphas_cumprod
    alpha_prod_t = acp[t]
    alpha_prod_t_prev = acp[prev_t] if prev_t >= 0 else sched.one
    beta_prod_t = 1 - alpha_prod_t
    beta_prod_t_prev = 1 - alpha_prod_t_prev
    current_alpha_t = alpha_prod_t / alpha_prod_t_prev
    current_beta_t = 1 - current_alpha_t
    kind = sched.config.prediction_type
    if kind == "epsilon":
        x0 = (sample - beta_prod_t ** (0.5) * model_output) / alpha_prod_t ** (0.5)
    elif kind == "sample":
        x0 = model_output
    else:  # v_prediction
        x0 = (alpha_prod_t**0.5) * sample - (beta_prod_t**0.5) * model_output
    if sched.config.clip_sample:
        x0 = x0.clamp(-sched.config.clip_sample_range, sched.config.clip_sample_range)
    x0_coeff = (alpha_prod_t_prev ** (0.5) * current_beta_t) / beta_prod_t
    xt_coeff = current_alpha_t ** (0.5) * beta_prod_t_prev / beta_prod_t
    prev = x0_coeff * x0 + xt_coeff * sample
    if noise is not None:
        variance = torch.clamp((1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t, min=1e-20)
        prev = prev + (variance**0.5) * noise
    return prev


def _noise(gens: list, shape: tuple, device: torch.device) -> torch.Tensor:
    """One standard normal draw per image from its own generator, copied to the device without a host sync."""
    x = torch.stack([torch.randn(shape, generator=g) for g in gens])
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def compile_for_sampling(unet: torch.nn.Module) -> torch.nn.Module:
    """torch.compile for a U-Net whose weights no longer change (a standalone sampler): inductor's `freezing` folds
    the weights into the graph as constants (on the CPU, prepacked oneDNN convolutions). Not for a model that is still
    trained: a frozen graph keeps the weights it was compiled with."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(unet)


@torch.no_grad()
def ddpm_sample(unet: torch.nn.Module, scheduler_config, seeds: Sequence[int], num_inference_steps: int,
                batch_size: int = 256, device: torch.device | str = "cpu",
                autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                scheduler_kind: str = "ddpm", on_batch: Optional[Callable[[int], None]] = None) -> torch.Tensor:
    """Images for `seeds` as uint8 [N, H, W, 3] on the CPU; respaced DDPM ancestral sampling when steps < T.

    Image i's initial noise and every step's noise come from torch.Generator('cpu').manual_seed(seeds[i]), drawn in
    the order DDPMPipeline draws them: the result equals DDPMPipeline(...)(generator=[one generator per image]).
    """
    device = torch.device(device)
    unet_cfg = getattr(unet, "config", None)
    size = unet_cfg.sample_size if unet_cfg is not None else None
    channels = unet_cfg.in_channels if unet_cfg is not None else 3
    shape = (channels, size, size) if isinstance(size, int) else (channels, *size)
    out = []
    for start in range(0, len(seeds), batch_size):
        chunk = seeds[start : start + batch_size]
        gens = [torch.Generator("cpu").manual_seed(int(s)) for s in chunk]
        x = _noise(gens, shape, device)
        sched = make_scheduler(scheduler_config, scheduler_kind)
        sched.set_timesteps(num_inference_steps)
        own_step = scheduler_kind == "ddpm" and sched.config.variance_type == "fixed_small" and not sched.config.thresholding
        timesteps = sched.timesteps  # CPU
        t_device = timesteps.to(device)
        for i, t in enumerate(timesteps):
            with autocast():
                model_out = unet(x, t_device[i]).sample
            if own_step:
                prev_t = int(timesteps[i + 1]) if i + 1 < len(timesteps) else -1
                noise = _noise(gens, shape, device) if t > 0 else None
                x = ddpm_step(sched, model_out.float(), t, prev_t, x, noise)
            elif scheduler_kind == "ddpm":
                x = sched.step(model_out.float(), t, x, generator=gens).prev_sample
            else:
                x = sched.step(model_out.float(), t, x, eta=0.0).prev_sample
        out.append(to_uint8(x).cpu())
        if on_batch is not None:
            on_batch(len(chunk))
    if not out:
        return torch.zeros((0, *shape[1:], shape[0]), dtype=torch.uint8)
    return torch.cat(out)


def shard(seeds: Sequence[int], rank: int, world: int) -> tuple[list[int], int]:
    """This rank's contiguous share of `seeds`, padded to equal length across ranks; returns (seeds, real count).
    Kept instead of accelerator.split_between_processes(apply_padding=True), which gives the first ranks one more
    item: its padded shares, gathered, are not in seed order."""
    per = math.ceil(len(seeds) / world) if seeds else 0
    mine = list(seeds[rank * per : (rank + 1) * per])
    real = len(mine)
    pad = [seeds[-1]] * (per - real) if seeds else []
    return mine + pad, real


def generate_distributed(accelerator, unet, scheduler_config, seeds: Sequence[int], num_inference_steps: int,
                         batch_size: int = 256, scheduler_kind: str = "ddpm", autocast=None) -> torch.Tensor:
    """All ranks share the seeds; every rank returns all N images (uint8 [N, H, W, 3], CPU), in seed order."""
    world, rank = accelerator.num_processes, accelerator.process_index
    mine, _ = shard(seeds, rank, world)
    imgs = ddpm_sample(unet, scheduler_config, mine, num_inference_steps, batch_size, accelerator.device,
                       autocast or accelerator.autocast, scheduler_kind)
    if world > 1:
        imgs = accelerator.gather(imgs.to(accelerator.device)).cpu()
    return imgs[: len(seeds)]


def save_grid(images: torch.Tensor | np.ndarray, path: str | Path, nrow: Optional[int] = None) -> Path:
    """uint8 [N, H, W, 3] -> one PNG grid with 2 px gaps."""
    from PIL import Image

    arr = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    n, h, w, c = arr.shape
    nrow = nrow or max(1, int(math.ceil(math.sqrt(n))))
    ncol = int(math.ceil(n / nrow))
    pad = 2
    grid = np.full((ncol * (h + pad) + pad, nrow * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i in range(n):
        r, q = divmod(i, nrow)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + q * (w + pad) : pad + q * (w + pad) + w] = arr[i]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path)
    return path


SAMPLER_LABELS = {
    "ddpm": "ddpm (ancestral)",  # Ho et al. 2020, Alg. 2; respaced when fewer steps than T (Nichol & Dhariwal 2021)
    "ddim": "ddim (deterministic, NOT the DDPM protocol)",  # Song et al. 2021, eta = 0
}


def image_sampler_label(kind: str) -> str:
    """How a sampler is named in sampling.json and metrics.json."""
    return SAMPLER_LABELS[kind]
