"""FID / proxy FD during training: all ranks share the sampling, features are gathered, the main process scores.

The reference is either given (`--eval_ref_stats`), clean-fid's CIFAR-10 train statistics (Inception on CIFAR-10),
or built once from a fixed random subset of reference images passed through the training resolution's pipeline
(bilinear + antialias on [0, 255] floats, rounded to uint8 - the benchmark protocol) and cached by content.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .config import ConfigError, TrainConfig
from .data import ImageEntries, decode_all, default_cache_dir, open_entries
from .fid import INCEPTION, FeatureNet, clean_fid_reference, feature_stats, frechet_distance, load_stats, save_stats
from .image_sampler import ddpm_sample, shard

REFERENCE_SEED = 0  # the reference subset is the same for every training seed and method


def to_resolution_uint8(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> uint8 [N, S, S, 3]: bilinear + antialias on [0, 255] floats, rounded (PROTOCOL.md)."""
    y = x.float()
    if y.shape[-1] != resolution or y.shape[-2] != resolution:
        y = F.interpolate(y, size=(resolution, resolution), mode="bilinear", antialias=True, align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def reference_subset(images: torch.Tensor, num: int, resolution: int, seed: int = REFERENCE_SEED) -> torch.Tensor:
    """A fixed random subset of `num` images (uint8 [N, 3, H, W]) at the resolution, uint8 [num, S, S, 3]."""
    if num > len(images):
        raise ConfigError(f"the reference needs {num} images but the source has {len(images)}")
    idx = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:num]
    return torch.cat([to_resolution_uint8(images[idx[i : i + 1000]].cpu(), resolution) for i in range(0, num, 1000)])


def _source_key(cfg: TrainConfig) -> str:
    src = cfg.eval_ref_dir or cfg.train_data_dir or f"dataset:{cfg.dataset_name}:{cfg.dataset_config_name}"
    p = Path(src)
    if p.exists():
        st = p.stat()
        return f"{p.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    return src


def reference_stats(cfg: TrainConfig, featnet: FeatureNet, train_images: Optional[torch.Tensor],
                    log: Callable[[str], None] = print) -> dict:
    """{'mu', 'sigma'[, 'feats']} of the reference, computed once and cached under cache_dir/reference_stats/."""
    if cfg.eval_ref_stats:
        return load_stats(cfg.eval_ref_stats)
    if featnet.spec == INCEPTION and not cfg.eval_ref_dir and (cfg.dataset_name or "").lower() in ("cifar10", "cifar-10") \
            and not cfg.train_data_dir and cfg.resolution == 32:
        mu, sigma = clean_fid_reference("cifar10", 32, cfg.eval_mode, "train")
        return {"mu": mu, "sigma": sigma}
    key = json.dumps([_source_key(cfg), cfg.resolution, cfg.eval_ref_num_images, REFERENCE_SEED, featnet.identity,
                      cfg.max_train_samples if not cfg.eval_ref_dir else None])
    path = default_cache_dir(cfg.cache_dir) / "reference_stats" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz")
    if path.exists():
        return load_stats(path)
    t0 = time.perf_counter()
    if cfg.eval_ref_dir or train_images is None:
        from .config import replace

        src_cfg = replace(cfg, train_data_dir=cfg.eval_ref_dir or cfg.train_data_dir)
        entries: ImageEntries = open_entries(src_cfg)
        images = decode_all(entries, cfg.resolution)
    else:
        images = train_images
    ref = reference_subset(images, cfg.eval_ref_num_images, cfg.resolution)
    feats = featnet(ref)
    mu, sigma = feature_stats(feats)
    save_stats(path, mu, sigma, feats, key=key)
    log(f"eval: reference statistics of {len(ref)} images built in {time.perf_counter() - t0:.1f}s -> {path}")
    return {"mu": mu, "sigma": sigma, "feats": feats}


class InTrainingEvaluator:
    """Generates `eval_num_images` with the EMA model (seeds eval_seed_offset + i) on all ranks and scores them."""

    def __init__(self, cfg: TrainConfig, accelerator, train_images: Optional[torch.Tensor], log=print):
        self.cfg, self.accelerator = cfg, accelerator
        self.featnet = FeatureNet(cfg.eval_feature_extractor, accelerator.device, cfg.eval_mode)
        with accelerator.main_process_first():
            self.ref = reference_stats(cfg, self.featnet, train_images, log)
        self.points = set(cfg.eval_at_steps or ())

    def due(self, step: int) -> bool:
        return step in self.points or bool(self.cfg.eval_steps and step % self.cfg.eval_steps == 0)

    def __call__(self, unet, scheduler_config) -> dict:
        """Every rank calls this; the main process gets {'fd' | 'fid', ...}, the others {}."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        seeds = [cfg.eval_seed_offset + i for i in range(cfg.eval_num_images)]
        mine, _ = shard(seeds, acc.process_index, acc.num_processes)
        imgs = ddpm_sample(unet, scheduler_config, mine, cfg.eval_inference_steps, cfg.eval_batch_size, acc.device,
                           acc.autocast)
        feats = torch.from_numpy(self.featnet(imgs)).to(acc.device)
        if acc.num_processes > 1:
            feats = acc.gather(feats)
        if not acc.is_main_process:
            return {}
        feats = feats[: len(seeds)].cpu().numpy()
        mu, sigma = feature_stats(feats)
        value = frechet_distance(mu, sigma, self.ref["mu"], self.ref["sigma"])
        return {self.featnet.metric: value, "eval_images": len(seeds), "eval_inference_steps": cfg.eval_inference_steps,
                "eval_sampler": "ddpm", "eval_seconds": round(time.perf_counter() - t0, 2),
                "feature_extractor": self.featnet.name}
