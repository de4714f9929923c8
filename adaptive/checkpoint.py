"""Resumable checkpoints: `accelerator.save_state` into a temporary folder, a manifest, then an atomic rename.

Layout of `output_dir/checkpoint-<step>/`: Accelerate's files (model.safetensors, optimizer.bin, scheduler.bin,
scaler.pt, random_states_<rank>.pkl for EVERY rank), ours (training_state.pt: progress, timestep sampler, EMA
counters; ema.safetensors), the run's config.json, and manifest.json (size + sha256 of every file), written last.
A folder without a valid manifest is not a checkpoint. Nothing is loaded with pickle code execution: safetensors,
and torch.load(weights_only=True) for the rest (Accelerate's own loader uses weights_only=True too).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Optional

import torch

from .config import ConfigError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
MANIFEST = "manifest.json"
STATE_FILE = "training_state.pt"

# Config keys that change the model or the objective: a checkpoint that differs in any of them is refused.
MODEL_OBJECTIVE_KEYS = (
    "resolution", "block_out_channels", "layers_per_block", "down_block_types", "up_block_types",
    "attention_head_dim", "dropout", "norm_num_groups", "ddpm_num_steps", "ddpm_beta_schedule", "ddpm_beta_start",
    "ddpm_beta_end", "prediction_type", "loss_weighting", "snr_gamma", "p2_gamma", "p2_k", "timestep_sampler",
    "use_ema",
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_manifest(folder: Path, step: int) -> None:
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[str(p.relative_to(folder))] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / MANIFEST)


def verify_checkpoint(folder: Path, full: bool = True) -> Optional[str]:
    """None if `folder` is a complete, intact checkpoint; otherwise the reason it is not."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (incomplete write)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for name, meta in files.items():
        p = folder / name
        if not p.is_file():
            return f"missing file {name}"
        if p.stat().st_size != meta["bytes"]:
            return f"{name} has {p.stat().st_size} bytes, expected {meta['bytes']}"
        if full and _sha256(p) != meta["sha256"]:
            return f"{name} is corrupt (sha256 mismatch)"
    for required in ("model.safetensors", STATE_FILE, "config.json"):
        if required not in files:
            return f"{required} missing from manifest"
    return None


def checkpoint_step(folder: Path) -> Optional[int]:
    m = CHECKPOINT_RE.match(Path(folder).name)
    return int(m.group(1)) if m else None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-<step> folders, oldest first (validity not checked)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def find_latest(output_dir: Path, warn: Callable[[str], None] = print) -> Optional[Path]:
    """The newest valid checkpoint; invalid newer ones are skipped with a warning."""
    for folder in reversed(list_checkpoints(output_dir)):
        reason = verify_checkpoint(folder)
        if reason is None:
            return folder
        warn(f"warning: skipping {folder.name}: {reason}")
    return None


def resolve_resume(output_dir: Path, resume: Optional[str], warn: Callable[[str], None] = print) -> Optional[Path]:
    """'latest' -> newest valid checkpoint or None; a path -> that checkpoint, or ConfigError if it is not valid."""
    if not resume:
        return None
    if resume == "latest":
        return find_latest(output_dir, warn)
    path = Path(resume)
    if not path.exists() and (Path(output_dir) / resume).exists():
        path = Path(output_dir) / resume
    if not path.exists():
        raise ConfigError(f"--resume_from_checkpoint {resume}: no such checkpoint")
    reason = verify_checkpoint(path)
    if reason is not None:
        raise ConfigError(f"--resume_from_checkpoint {path} is not a valid checkpoint: {reason}")
    return path


def incompatible_keys(saved: dict, current: dict) -> list[str]:
    """Keys that change the model or the objective and differ between two config dicts."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v
    return [k for k in MODEL_OBJECTIVE_KEYS if norm(saved.get(k)) != norm(current.get(k))]


def changed_keys(saved: dict, current: dict, ignore=("resume_from_checkpoint", "overwrite_output_dir")) -> list[str]:
    keys = set(saved) | set(current)
    return sorted(k for k in keys if k not in ignore and saved.get(k) != current.get(k))


def read_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def save_checkpoint(accelerator, output_dir: Path, step: int, config: dict, total_limit: Optional[int] = None) -> Path:
    """Every rank calls this. Writes checkpoint-<step> atomically and keeps the newest `total_limit`."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))  # models, optimizer, scheduler, scaler, each rank's RNG, our state via hooks
    if accelerator.is_main_process:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    accelerator.wait_for_everyone()  # every rank's files are written
    if os.environ.get("ADAPTIVE_TEST_CHECKPOINT_PAUSE"):  # fault-injection hook for the kill tests: a wide window
        import time  # in which the checkpoint is half written

        time.sleep(float(os.environ["ADAPTIVE_TEST_CHECKPOINT_PAUSE"]))
    if accelerator.is_main_process:
        write_manifest(tmp, step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(output_dir)
        if total_limit is not None:
            rotate(output_dir, total_limit)
    accelerator.wait_for_everyone()
    return final


def rotate(output_dir: Path, keep: int) -> None:
    """Delete the oldest complete checkpoints beyond `keep`, and stale temporary folders."""
    valid = [p for p in list_checkpoints(output_dir) if verify_checkpoint(p, full=False) is None]
    for old in valid[: max(0, len(valid) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def save_object_state(path: Path, state: dict) -> None:
    """torch.save of plain tensors / numbers / strings / dicts / lists (loadable with weights_only=True)."""
    tmp = Path(str(path) + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_object_state(path: Path) -> dict:
    """The inverse of save_object_state, without executing pickled code."""
    return torch.load(path, map_location="cpu", weights_only=True)
