"""FID / proxy FD during training: all ranks share the sampling, features are gathered, the main process scores.

The reference is either given (`--eval_ref_stats`, checked against the network and resolution), clean-fid's CIFAR-10
train statistics (Inception on CIFAR-10 at 32 px), or built once (adaptive/fid.py: a fixed random subset of the
reference images through the training resolution's pipeline, cached by content) - the same statistics and the same
feature pipeline as evaluate_fid.py.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from .config import TrainConfig, replace
from .data import decode_all, open_entries
from .sources import default_cache_dir
from .fid import (INCEPTION, FeatureNet, clean_fid_reference, feature_stats, frechet_distance, load_reference_stats,
                  reference_stats, reference_subset, warn_if_few)
from .image_sampler import ddpm_sample, shard
from .progress import progress


def training_reference(cfg: TrainConfig, featnet: FeatureNet, train_images: Optional[torch.Tensor], log=print,
                       show: bool = True) -> dict:
    """{'mu', 'sigma'[, 'feats'], 'name'} of the configured reference at the training resolution; `train_images`: the
    decoded training data if at hand (else the training data is decoded here, as many images as training uses)."""
    if cfg.eval_ref_stats:
        return load_reference_stats(cfg.eval_ref_stats, featnet, (cfg.resolution, cfg.resolution))
    if featnet.spec == INCEPTION and not cfg.eval_ref_dir \
            and (cfg.dataset_name or "").lower() in ("cifar10", "cifar-10") \
            and not cfg.train_data_dir and cfg.resolution == 32:
        mu, sigma = clean_fid_reference("cifar10", 32, cfg.eval_mode, "train")
        return {"mu": mu, "sigma": sigma, "name": "cifar10-train (clean-fid)"}
    if cfg.eval_ref_dir or train_images is None:
        entries = open_entries(replace(cfg, train_data_dir=cfg.eval_ref_dir or cfg.train_data_dir),
                               "--eval_ref_dir" if cfg.eval_ref_dir else "--train_data_dir")
        limit = None if cfg.eval_ref_dir else cfg.max_train_samples
        label = f"reference statistics: decoding {entries.description}" if show else None
        images = decode_all(entries, cfg.resolution, limit=limit, label=label,
                            cache_dir=default_cache_dir(cfg.cache_dir), log=log)
        source = entries.description
    else:
        images, source = train_images, "the training data"
    ref = reference_subset(images, cfg.eval_ref_num_images, cfg.resolution)
    return reference_stats(ref, featnet, default_cache_dir(cfg.cache_dir), source, log, show)


class InTrainingEvaluator:
    """Generates `eval_num_images` with the EMA model (seeds eval_seed_offset + i) on all ranks and scores them."""

    def __init__(self, cfg: TrainConfig, accelerator, train_images: Optional[torch.Tensor], log=print):
        self.cfg, self.accelerator = cfg, accelerator
        self.featnet = FeatureNet(cfg.eval_feature_extractor, accelerator.device, cfg.eval_mode,
                                  flag="--eval_feature_extractor")
        with accelerator.main_process_first():
            self.ref = training_reference(cfg, self.featnet, train_images, log, accelerator.is_main_process)
        if accelerator.is_main_process:  # as evaluate_fid.py warns about its --samples
            warn_if_few(cfg.eval_num_images, self.ref["mu"].shape[0], "the evaluation (--eval_num_images)", log)
        self.points = set(cfg.eval_at_steps or ())

    def due(self, step: int) -> bool:
        return step in self.points or bool(self.cfg.eval_steps and step % self.cfg.eval_steps == 0)

    def __call__(self, unet, scheduler_config) -> dict:
        """Every rank calls this; the main process gets {'fd' | 'fid', ...}, the others {}."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        seeds = [cfg.eval_seed_offset + i for i in range(cfg.eval_num_images)]
        mine, _ = shard(seeds, acc.process_index, acc.num_processes)
        main = acc.is_main_process
        with progress(len(seeds), "evaluation: sampling", "img", enabled=main) as bar:
            # the main rank's pace stands for all ranks
            imgs = ddpm_sample(unet, scheduler_config, mine, cfg.eval_inference_steps, cfg.eval_batch_size,
                               acc.device, acc.autocast, on_batch=lambda n: bar.update(n * acc.num_processes))
        feats = torch.from_numpy(self.featnet(imgs, desc="evaluation: features" if main else None)).to(acc.device)
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
