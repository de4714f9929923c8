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

    Each step is Diffusers' DDPMScheduler.step (DDIMScheduler.step with eta 0 for 'ddim'). Image i's initial noise and
    every step's noise come from torch.Generator('cpu').manual_seed(seeds[i]), drawn in the order DDPMPipeline draws
    them: the result equals DDPMPipeline(...)(generator=[one generator per image]).
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
        t_device = sched.timesteps.to(device)
        step_kwargs = {"generator": gens} if scheduler_kind == "ddpm" else {"eta": 0.0}
        for i, t in enumerate(sched.timesteps):
            with autocast():
                model_out = unet(x, t_device[i]).sample
            # DDPM draws this step's noise from the images' CPU generators; on a GPU its copy to the device is a sync
            # point, once per denoising step (docs/evaluation.md)
            x = sched.step(model_out.float(), t, x, **step_kwargs).prev_sample
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


GRID_MIN_PX = 256  # sample grids are enlarged (nearest neighbour, an integer factor) to at least this size


def save_grid(images: torch.Tensor | np.ndarray, path: str | Path, nrow: Optional[int] = None) -> Path:
    """uint8 [N, H, W, 3] -> one PNG grid with 2 px gaps, enlarged by an integer factor (nearest neighbour: every
    pixel becomes a k x k block) until its shorter side is at least GRID_MIN_PX."""
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
    k = max(1, math.ceil(GRID_MIN_PX / min(grid.shape[:2])))
    grid = grid.repeat(k, axis=0).repeat(k, axis=1)
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
