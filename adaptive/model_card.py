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


def fmt_duration(seconds: float) -> str:
    """'42 s', '12.5 min' or '1.50 h'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


CIFAR10_HUB = "uoft-cs/cifar10"  # the Hub's CIFAR-10, what torchvision's download is


def training_data(cfg) -> tuple[str, list[str]]:
    """The training data in words (one card row) and the Hub datasets it is, for the `datasets:` metadata. A local
    --train_data_dir wins over --dataset_name (as adaptive.data.open_entries); its path is shown by file name only."""
    if cfg.train_data_dir:
        name = Path(str(cfg.train_data_dir)).name or str(cfg.train_data_dir)
        return f"local images: {name}", []
    if not cfg.dataset_name:
        return "unknown", []
    if cfg.dataset_name.lower() in ("cifar10", "cifar-10"):
        return f"CIFAR-10, train split (torchvision; on the Hub: {CIFAR10_HUB})", [CIFAR10_HUB]
    return f"{cfg.dataset_name} (Hub dataset)", [cfg.dataset_name]


def settings_rows(cfg, progress, info: dict, posthoc: Optional[dict] = None) -> list[str]:
    """The card's short table of how the model was trained (the full config follows, folded)."""
    batch, precision = info.get("global_batch"), info.get("mixed_precision") or cfg.mixed_precision or "no"
    steps = f"{progress.step:,}" + (f" x batch {batch:,} = {progress.images_seen:,} images" if batch else "")
    rows = [_row("training data", training_data(cfg)[0]), _row("optimizer steps", steps)]
    if progress.train_seconds is not None:
        rows.append(_row("training wall-clock", f"{fmt_duration(progress.train_seconds)} on {hardware(info)}"))
    rows += [
        _row("resolution, parameters", f"{cfg.resolution} px, {info.get('num_parameters', 0):,}"),
        _row("timestep sampler, loss weighting", f"{cfg.timestep_sampler}, {cfg.loss_weighting}"),
        _row("optimizer", f"AdamW lr {cfg.learning_rate:g} ({cfg.lr_scheduler}, {cfg.lr_warmup_steps:,} warm-up "
                          f"steps), betas {cfg.adam_beta1:g}/{cfg.adam_beta2:g}"),
        _row("precision", {"no": "fp32"}.get(precision, f"{precision} autocast")),
    ]
    if posthoc:
        snaps = posthoc["snapshots"]
        widths = ", ".join(f"{w:g}" for w in sorted({x["sigma_rel"] for x in snaps}))
        at = ", ".join(f"{t:,}" for t in sorted({x["step"] for x in snaps}))
        rows.append(_row("EMA", f"post-hoc (Karras et al. 2024): sigma_rel {posthoc['sigma_rel']:g} at step "
                                f"{posthoc['at_step']:,}, from {len(snaps)} snapshots (sigma_rel {widths} at "
                                f"steps {at})"))
    else:
        rows.append(_row("EMA", f"on, max decay {cfg.ema_max_decay} (the exported U-Net is the EMA)" if cfg.use_ema
                         else "off"))
    return rows


def metric_rows(metrics: dict) -> list[str]:
    n = metrics.get("num_images", metrics.get("eval_images", "?"))
    sampler = metrics.get("sampler", metrics.get("eval_sampler", "ddpm"))
    steps = metrics.get("num_inference_steps", metrics.get("eval_inference_steps", ""))
    at = f" at step {metrics['step']:,}" if "step" in metrics else ""
    return [_row(label, f"{metrics[key]:.4g} ({n} images, {sampler} {steps} steps{at})")
            for key, label in (("fid", "FID"), ("proxy_fd", "proxy FD (not FID)"), ("kid", "KID"),
                               ("precision", "precision"), ("recall", "recall")) if key in metrics]


def build_model_card(folder: Path, cfg, progress, info: dict, metrics: Optional[dict] = None,
                     repo_id: Optional[str] = None, posthoc: Optional[dict] = None):
    """The model card (a `huggingface_hub.ModelCard`) of the pipeline exported in `folder`: metadata for the Hub
    (library diffusers, pipeline tag, tags, the training data's Hub `datasets`, `license` when --license gives one),
    a usage snippet that loads `repo_id` when the pipeline is pushed, else the folder's absolute path (it works from
    any directory), the key settings and latest metrics in a short table, the full config folded (<details>).
    `posthoc`: {'sigma_rel', 'at_step', 'snapshots'} for a post-hoc EMA reconstruction (reconstruct_ema.py)."""
    from diffusers.utils.hub_utils import populate_model_card
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    datasets = training_data(cfg)[1]
    data = ModelCardData(pipeline_tag="unconditional-image-generation", **({"datasets": datasets} if datasets else {}),
                         **({"license": cfg.license} if getattr(cfg, "license", None) else {}))
    steps, total = cfg.ddpm_num_inference_steps, cfg.ddpm_num_steps
    how = "the full DDPM chain" if steps == total else f"DDPM ancestral, {steps} of {total} steps, as the sample grids"
    title = f"# DDPM trained with adaptive-diffusion ({cfg.preset})"
    if posthoc:
        title += f", post-hoc EMA sigma_rel {posthoc['sigma_rel']:g}"
    body = [
        title,
        "",
        "```python",
        "from diffusers import DDPMPipeline",
        "",
        f"pipe = DDPMPipeline.from_pretrained({json.dumps(repo_id or str(folder.resolve()))})",
        f"images = pipe(batch_size=16, num_inference_steps={steps}).images  # {how}",
        "```",
        "",
        "| | |",
        "|---|---|",
        *settings_rows(cfg, progress, info, posthoc),
        *metric_rows(metrics or {}),
    ]
    grid = info.get("grid")
    if grid:
        try:
            body += ["", f"![samples]({Path(grid).resolve().relative_to(folder.resolve()).as_posix()})"]
        except ValueError:
            pass
    config = json.dumps(public_config(cfg.to_dict(), folder), indent=2, sort_keys=True)
    body += ["", "<details>", "<summary>Full training configuration (config.json, local paths redacted)</summary>", "",
             "```json", config, "```", "", "</details>", ""]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))
    # diffusers' own helper sets library_name and the tags (its load_or_create_model_card template is not used: it
    # adds three "TODO" sections - snippet, limitations, training data - that this card fills; docs/training.md)
    return populate_model_card(card, tags=[*TAGS, f"timestep-sampler-{cfg.timestep_sampler}".replace("_", "-")])


def write_model_card(folder: Path, cfg, progress, info: dict, metrics: Optional[dict] = None,
                     repo_id: Optional[str] = None, posthoc: Optional[dict] = None) -> Path:
    """Writes folder/README.md (`build_model_card`)."""
    path = Path(folder) / "README.md"
    build_model_card(folder, cfg, progress, info, metrics, repo_id, posthoc).save(path)
    return path
