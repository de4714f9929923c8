"""README.md model card for an exported DDPMPipeline folder (no secrets: built from the public config only)."""

from __future__ import annotations

import json
from pathlib import Path


def write_model_card(folder: Path, cfg, progress, info: dict, metrics: dict | None = None) -> Path:
    """Writes folder/README.md: how the pipeline was trained, how long, with which timestep method, latest FID."""
    grid = info.get("grid")
    grid_rel = None
    if grid:
        try:
            grid_rel = Path(grid).resolve().relative_to(folder.resolve())
        except ValueError:
            grid_rel = None
    hours = progress.train_seconds / 3600
    lines = [
        "---",
        "library_name: diffusers",
        "pipeline_tag: unconditional-image-generation",
        "tags: [ddpm, diffusers, unconditional-image-generation, adaptive-timestep-sampling]",
        "---",
        "",
        f"# DDPM trained with adaptive-diffusion ({cfg.preset})",
        "",
        "```python",
        "from diffusers import DDPMPipeline",
        f"pipe = DDPMPipeline.from_pretrained(\"{cfg.hub_model_id if getattr(cfg, 'hub_model_id', None) else folder.name}\")",
        "images = pipe(batch_size=16, num_inference_steps=1000).images",
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| optimizer steps | {progress.step:,} |",
        f"| training images seen | {progress.images_seen:,} |",
        f"| training wall-clock | {hours:.2f} h on {info.get('world_size', 1)} x {info.get('device_name') or info.get('device')} |",
        f"| resolution | {cfg.resolution} px |",
        f"| parameters | {info.get('num_parameters', 0):,} |",
        f"| timestep sampler | {cfg.timestep_sampler} |",
        f"| loss weighting | {cfg.loss_weighting} |",
        f"| EMA | {'max decay ' + str(cfg.ema_max_decay) if cfg.use_ema else 'off'} (the exported U-Net is the EMA)"
        if cfg.use_ema else "| EMA | off |",
    ]
    if metrics:
        n = metrics.get("num_images", metrics.get("eval_images", "?"))
        sampler = metrics.get("sampler", metrics.get("eval_sampler", "ddpm"))
        steps = metrics.get("num_inference_steps", metrics.get("eval_inference_steps", ""))
        for k, label in (("fid", "FID"), ("proxy_fd", "proxy FD (not FID)"), ("kid", "KID"), ("precision", "precision"),
                         ("recall", "recall")):
            if k in metrics:
                at = f" at step {metrics['step']:,}" if "step" in metrics else ""
                lines.append(f"| {label} | {metrics[k]:.4g} ({n} images, {sampler} {steps} steps{at}) |")
    if grid_rel:
        lines += ["", f"![samples]({grid_rel.as_posix()})"]
    lines += ["", "## Training configuration", "", "```json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "```", ""]
    path = folder / "README.md"
    path.write_text("\n".join(lines))
    return path
