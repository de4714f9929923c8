"""What the public sees of a run: the README.md model card of an exported DDPMPipeline folder
(`huggingface_hub.ModelCard` / `ModelCardData`) and the run config without local paths (`public_config`).

No secrets (built from the public config only) and no local absolute path: paths inside the run folder become
relative to it, other local paths their file name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Optional

TAGS = ["diffusers", "ddpm", "unconditional-image-generation", "adaptive-timestep-sampling"]

_WINDOWS_ABSOLUTE = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\)")


def _is_local_path(value: str) -> bool:
    """Absolute (POSIX or Windows), home-relative, or explicitly relative ("./", "../") path strings. A Hub id such
    as "user/dataset" or a bare "runs/ddpm" is not taken for one."""
    return (value.startswith(("/", "~", "./", "../", ".\\", "..\\")) or bool(_WINDOWS_ABSOLUTE.match(value)))


def redact_paths(value, root: Path):
    """`value` (JSON-ready: dict / list / str / ...) with every local path string replaced: inside `root` -> the
    path relative to it ("." for root itself), elsewhere -> its file name."""
    if isinstance(value, dict):
        return {k: redact_paths(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_paths(v, root) for v in value]
    if not isinstance(value, str) or not _is_local_path(value):
        return value
    if _WINDOWS_ABSOLUTE.match(value):
        return PureWindowsPath(value).name or "<local>"
    path = Path(os.path.expanduser(value)).resolve()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()  # "." for root itself
    except ValueError:
        return PurePosixPath(path).name or "<local>"


def public_config(config: dict, root: Path) -> dict:
    """A run config (TrainConfig.to_dict(): no secrets) as published: local paths redacted (`redact_paths`)."""
    return redact_paths(config, root)


def hardware(info: dict) -> str:
    """'1 x CPU', '8 x NVIDIA H100 80GB HBM3', ... from run_info."""
    kind = str(info.get("device") or "cpu").split(":")[0]
    if kind == "cuda" and info.get("device_name"):
        name = info["device_name"]
    else:
        name = {"cpu": "CPU", "mps": "Apple MPS", "xpu": "Intel XPU"}.get(kind, kind.upper())
    return f"{info.get('world_size', 1)} x {name}"


def _row(label: str, value) -> str:
    return f"| {label} | {str(value).replace('|', '/')} |"


def build_model_card(folder: Path, cfg, progress, info: dict, metrics: Optional[dict] = None,
                     repo_id: Optional[str] = None):
    """The model card (a `huggingface_hub.ModelCard`) of the pipeline exported in `folder`: metadata for the Hub
    (library diffusers, pipeline tag, tags), a usage snippet loading `repo_id`, how it was trained, latest metrics."""
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    data = ModelCardData(library_name="diffusers", pipeline_tag="unconditional-image-generation",
                         tags=[*TAGS, f"timestep-sampler-{cfg.timestep_sampler}".replace("_", "-")])
    load_from = repo_id or cfg.hub_model_id or folder.name
    ema = f"on, max decay {cfg.ema_max_decay} (the exported U-Net is the EMA)" if cfg.use_ema else "off"
    rows = [
        "| | |",
        "|---|---|",
        _row("optimizer steps", f"{progress.step:,}"),
        _row("training images seen", f"{progress.images_seen:,}"),
        _row("training wall-clock", f"{progress.train_seconds / 3600:.2f} h on {hardware(info)}"),
        _row("resolution", f"{cfg.resolution} px"),
        _row("parameters", f"{info.get('num_parameters', 0):,}"),
        _row("timestep sampler", cfg.timestep_sampler),
        _row("loss weighting", cfg.loss_weighting),
        _row("EMA", ema),
    ]
    if metrics:
        n = metrics.get("num_images", metrics.get("eval_images", "?"))
        sampler = metrics.get("sampler", metrics.get("eval_sampler", "ddpm"))
        steps = metrics.get("num_inference_steps", metrics.get("eval_inference_steps", ""))
        at = f" at step {metrics['step']:,}" if "step" in metrics else ""
        for key, label in (("fid", "FID"), ("proxy_fd", "proxy FD (not FID)"), ("kid", "KID"),
                           ("precision", "precision"), ("recall", "recall")):
            if key in metrics:
                rows.append(_row(label, f"{metrics[key]:.4g} ({n} images, {sampler} {steps} steps{at})"))
    body = [
        f"# DDPM trained with adaptive-diffusion ({cfg.preset})",
        "",
        "```python",
        "from diffusers import DDPMPipeline",
        "",
        f"pipe = DDPMPipeline.from_pretrained({json.dumps(load_from)})",
        "images = pipe(batch_size=16, num_inference_steps=1000).images",
        "```",
        "",
        *rows,
    ]
    grid = info.get("grid")
    if grid:
        try:
            body += ["", f"![samples]({Path(grid).resolve().relative_to(folder.resolve()).as_posix()})"]
        except ValueError:
            pass
    config = json.dumps(public_config(cfg.to_dict(), folder), indent=2, sort_keys=True)
    body += ["", "## Training configuration", "", "```json", config, "```", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


def write_model_card(folder: Path, cfg, progress, info: dict, metrics: Optional[dict] = None,
                     repo_id: Optional[str] = None) -> Path:
    """Writes folder/README.md (`build_model_card`)."""
    path = Path(folder) / "README.md"
    build_model_card(folder, cfg, progress, info, metrics, repo_id).save(path)
    return path
