"""Resumable checkpoints: `accelerator.save_state` into a temporary folder, a manifest, then an atomic rename.

Layout of `output_dir/checkpoint-<step>/`: Accelerate's files (model.safetensors, optimizer.bin, scheduler.bin,
scaler.pt, random_states_<rank>.pkl for EVERY rank), ours (TrainState: training_state.pt with the progress, timestep
sampler and EMA counters; unet_ema/, the EMA U-Net in save_pretrained layout), the run's config.json, and
manifest.json (size + sha256 of every file), written last. A folder without a valid manifest is not a checkpoint.
Nothing is loaded with pickle code execution: safetensors, and torch.load(weights_only=True) for the rest
(Accelerate's own loader uses weights_only=True too).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import zipfile
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .config import MODEL_KEYS, ConfigError, current_keys
from .config import read_config as read_config_file
from .faults import agree, writing

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
MANIFEST = "manifest.json"  # size + sha256 of every file; written last
# in a checkpoint written while the loss was out of its running range (session.LossRange): such a checkpoint is never
# `latest` and never the reason a healthy one is rotated out; naming it resumes it all the same
OUT_OF_RANGE = "loss_out_of_range.json"
STATE_FILE = "training_state.pt"  # TrainState: progress, timestep sampler, EMA counters
EMA_DIR = "unet_ema"  # the EMA U-Net, UNet2DModel.save_pretrained layout (any Diffusers tool loads it)
EMA_FILE = "ema.safetensors"  # the EMA weights in checkpoints written before unet_ema/ (read only)
CONFIG_FILE = "config.json"  # the resolved config the checkpoint was trained with
MODEL_FILE = "model.safetensors"  # Accelerate's copy of the training weights


@dataclass
class Progress:
    """Where training is: the data position and clocks are pure functions of these."""

    step: int = 0  # optimizer steps done
    images_seen: int = 0  # global training images consumed
    train_seconds: float = 0.0  # wall-clock spent training (evaluation and previews excluded)

    def state_dict(self) -> dict:
        return {"step": self.step, "images_seen": self.images_seen, "train_seconds": self.train_seconds}

    def load_state_dict(self, s: dict) -> None:
        self.step, self.images_seen, self.train_seconds = (int(s["step"]), int(s["images_seen"]),
                                                           float(s["train_seconds"]))


@dataclass
class TrainState:
    """Our part of a checkpoint (STATE_FILE and EMA_FILE), saved and restored by hooks registered with the
    Accelerator."""

    progress: Progress
    timesteps: Any  # the TimestepSampler
    ema: Any = None  # EMA or None
    phema: Any = None  # PowerEMAs or None

    def state_dict(self) -> dict:
        return {
            "progress": self.progress.state_dict(),
            "sampler": self.timesteps.state_dict(),
            "ema_num_updates": self.ema.num_updates if self.ema else None,
            "phema": self.phema.state_dict() if self.phema else None,
        }

    def load_state_dict(self, s: dict) -> None:
        self.progress.load_state_dict(s["progress"])
        self.timesteps.load_state_dict(s["sampler"])
        if self.ema is not None:
            self.ema.num_updates = int(s["ema_num_updates"])
        if self.phema is not None:
            if not s.get("phema"):
                raise ConfigError("the checkpoint has no post-hoc EMA state; resume without --ema_snapshots")
            self.phema.load_state_dict(s["phema"])

    def save(self, folder: Path) -> None:
        save_object_state(Path(folder) / STATE_FILE, self.state_dict())
        if self.ema is not None:
            self.ema.model.save_pretrained(Path(folder) / EMA_DIR, safe_serialization=True)

    def load(self, folder: Path) -> None:
        path = Path(folder) / STATE_FILE
        with malformed(path):
            self.load_state_dict(load_object_state(path))
        if self.ema is not None:
            self.ema.model.load_state_dict(load_ema_weights(Path(folder)))

    def register(self, accelerator) -> None:
        """accelerator.save_state / load_state then carry this state (the main process writes it)."""
        accelerator.register_save_state_pre_hook(
            lambda models, weights, output_dir: self.save(output_dir) if accelerator.is_main_process else None)
        accelerator.register_load_state_pre_hook(lambda models, input_dir: self.load(input_dir))


def load_ema_weights(folder: Path) -> dict:
    """The EMA U-Net's state dict from a checkpoint (unet_ema/, or ema.safetensors of older checkpoints)."""
    from safetensors.torch import load_file

    new = Path(folder) / EMA_DIR / "diffusion_pytorch_model.safetensors"
    return load_file(str(new if new.is_file() else Path(folder) / EMA_FILE))



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
    """None if `folder` is a complete, intact checkpoint; otherwise the reason it is not (one line). `full` also
    checks every file's sha256 and that it opens (a manifest recomputed over a truncated file still fails here)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (incomplete write)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({_one_line(e)})"
    shape = _manifest_shape_error(files)
    if shape:
        return f"malformed {MANIFEST} ({shape})"
    for required in (MODEL_FILE, STATE_FILE, CONFIG_FILE):
        if required not in files:
            return f"{required} missing from manifest"
    for name, meta in files.items():
        p = folder / name
        if not p.is_file():
            return f"missing file {name}"
        if p.stat().st_size != meta["bytes"]:
            return f"{name} has {p.stat().st_size} bytes, expected {meta['bytes']}"
        if full and _sha256(p) != meta["sha256"]:
            return f"{name} is corrupt (sha256 mismatch)"
        problem = _unreadable(p) if full else None
        if problem:
            return f"{name} is unreadable (truncated or damaged: {problem})"
    return None


def _manifest_shape_error(files) -> Optional[str]:
    """What is wrong with the shape of a manifest's "files" (valid JSON can still be {"files": "abc"})."""
    if not isinstance(files, dict):
        return f'"files" is a {type(files).__name__}, not an object'
    for name, meta in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"file name {name!r} points outside the checkpoint"
        if not (isinstance(meta, dict) and type(meta.get("bytes")) is int and isinstance(meta.get("sha256"), str)):
            return f"entry {name!r} is not {{\"bytes\": int, \"sha256\": str}}"
    return None


def _unreadable(path: Path) -> Optional[str]:
    """Why `path` cannot be opened by its loader (safetensors header, torch.save zip + CRCs, JSON), or None."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt"):
                pass  # validates the header against the file's size
        elif path.suffix in (".bin", ".pt", ".pkl"):  # torch.save's zip format (Accelerate's files and ours)
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad:
                return f"CRC mismatch in {bad}"
        elif path.suffix == ".json":
            json.loads(path.read_text())
    except Exception as e:
        return _one_line(e)
    return None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


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
    """The newest valid checkpoint; invalid newer ones are skipped with a warning. None if there is no checkpoint;
    ConfigError if there are some but none is valid (restarting at step 0 would silently rewrite the run)."""
    broken = []
    for folder in reversed(list_checkpoints(output_dir)):
        reason = verify_checkpoint(folder) or out_of_range(folder)
        if reason is None:
            return folder
        warn(f"warning: skipping {folder.name}: {reason}")
        broken.append(f"{folder.name}: {reason}")
    if broken:
        raise ConfigError(f"--resume_from_checkpoint latest: no valid checkpoint in {output_dir} "
                          f"({'; '.join(broken)}); to start over instead, rerun with --overwrite_output_dir")
    return None


def out_of_range(folder: Path) -> Optional[str]:
    """Why `latest` skips a checkpoint written while the loss was out of its running range (None: it was not)."""
    if not (Path(folder) / OUT_OF_RANGE).exists():
        return None
    try:
        left = json.loads((Path(folder) / OUT_OF_RANGE).read_text()).get("left_at")
    except (OSError, ValueError, AttributeError):
        left = None
    return (f"written while the loss was out of its running range (it left it at step {left})" if left is not None
            else "written while the loss was out of its running range") + \
        f"; name it to resume it anyway: --resume_from_checkpoint {folder}"


def mark_out_of_range(output_dir: Path, vouched: Optional[int], left_at: int, spare: Optional[int] = None) -> list:
    """The loss has just left its running range at `left_at`: mark the checkpoints its windows do not vouch for
    (after step `vouched`; all without one), except the one at step `spare` (the resumed checkpoint: the settings
    changed since may be what broke it). Returns the marked names (main process)."""
    marked = []
    for folder in list_checkpoints(output_dir):
        step = checkpoint_step(folder)
        if (vouched is None or step > vouched) and step != spare and not (folder / OUT_OF_RANGE).exists():
            (folder / OUT_OF_RANGE).write_text(json.dumps({"step": step, "left_at": left_at}))
            marked.append(folder.name)
    return marked


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
    return [k for k in MODEL_KEYS if norm(saved.get(k)) != norm(current.get(k))]


def describe_changes(saved: dict, current: dict, keys) -> str:
    """'key: old -> new' for each key, '; '-separated; values as the flags take them (32,64,64; none)."""
    def fmt(v):
        return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else "none" if v is None else str(v)

    return "; ".join(f"{k}: {fmt(saved.get(k))} -> {fmt(current.get(k))}" for k in keys)


def changed_keys(saved: dict, current: dict, ignore=("resume_from_checkpoint", "overwrite_output_dir")) -> list[str]:
    """Keys whose values differ (a saved config's options of methods it did not use are not compared: configs of
    older versions kept every method's)."""
    saved = current_keys(saved)
    keys = set(saved) | set(current)
    return sorted(k for k in keys if k not in ignore and saved.get(k) != current.get(k))


def read_config(folder: Path) -> dict:
    """A checkpoint's config.json: a JSON object, else a one-line ConfigError naming the file."""
    return read_config_file(Path(folder) / CONFIG_FILE)


def save_checkpoint(accelerator, output_dir: Path, step: int, config: dict, total_limit: Optional[int] = None,
                    protect: Optional[int] = None, left_range_at: Optional[int] = None) -> Path:
    """Every rank calls this. Writes checkpoint-<step> atomically and keeps the newest `total_limit` (and the ones
    `rotate` protects); `left_range_at`: the loss is out of its running range since that step (the checkpoint is
    marked: OUT_OF_RANGE). A failed write
    (DiskFull when the disk is full) raises on every rank and leaves no partial folder; older checkpoints are kept."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    previous = [p.name for p in list_checkpoints(output_dir) if p != final][-1:]
    kept = f"the partial {tmp.name} was removed, {previous[0]} is intact" if previous else \
        f"the partial {tmp.name} was removed"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    error = None
    try:
        with writing(final.name, output_dir, kept):
            accelerator.save_state(str(tmp))  # models, optimizer, scheduler, scaler, each rank's RNG, our state (hooks)
            if accelerator.is_main_process:
                (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
                if left_range_at is not None:
                    (tmp / OUT_OF_RANGE).write_text(json.dumps({"step": step, "left_at": left_range_at}))
    except Exception as e:
        error = e
    try:
        agree(accelerator, error)  # every rank's files are written (or every rank raises)
        if accelerator.is_main_process:
            try:
                with writing(final.name, output_dir, kept):
                    write_manifest(tmp, step)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _fsync_dir(output_dir)
                if total_limit is not None:
                    rotate(output_dir, total_limit, protect)
            except Exception as e:
                error = e
        agree(accelerator, error)
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def rotate(output_dir: Path, keep: Optional[int], protect: Optional[int] = None) -> None:
    """Delete stale temporary folders (a write that was killed or failed) and the oldest complete checkpoints beyond
    `keep` (None: keep all), except the newest one at or before step `protect` (the last before a blow-up:
    session.LossRange) and the newest one not written out of the loss's range (OUT_OF_RANGE). Called after every
    checkpoint and once at the start of a run (main process, which holds the output folder's lock, so no other
    writer's temporary folder is live)."""
    for stale in Path(output_dir).glob(".checkpoint-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep is None:
        return
    valid = [p for p in list_checkpoints(output_dir) if verify_checkpoint(p, full=False) is None]
    kept = [p for p in valid if protect is not None and checkpoint_step(p) <= protect][-1:]
    kept += [p for p in valid if out_of_range(p) is None][-1:]  # the newest healthy one: what `latest` resumes
    for old in valid[: max(0, len(valid) - keep)]:
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, folder: Path) -> None:
    """accelerator.load_state(folder) on every rank; a verified checkpoint that still does not load (a tensor that
    does not fit the model, a damaged pickle inside a valid zip) is a one-line ConfigError naming it."""
    try:
        accelerator.load_state(str(folder))
    except ConfigError:
        raise
    except Exception as e:
        text = " ".join(str(e).split())
        if "Error(s) in loading state_dict" in text:  # torch's message: its first line names no file or key
            detail = text.split(":", 1)[1].strip() if ":" in text else text
            raise ConfigError(f"cannot resume from {folder}: its weights ({MODEL_FILE} or the EMA's) do not fit this "
                              f"model: {detail[:200]}{'...' if len(detail) > 200 else ''}") from None
        raise ConfigError(f"cannot resume from {folder}: {type(e).__name__}: {_one_line(e)}") from None


def read_progress(folder: Path) -> Progress:
    """The progress saved in a checkpoint (its training_state.pt), read without building the run."""
    progress, path = Progress(), Path(folder) / STATE_FILE
    with malformed(path):
        progress.load_state_dict(load_object_state(path)["progress"])
    return progress


def save_object_state(path: Path, state: dict) -> None:
    """torch.save of plain tensors / numbers / strings / dicts / lists (loadable with weights_only=True)."""
    tmp = Path(str(path) + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_object_state(path: Path) -> dict:
    """The inverse of save_object_state, without executing pickled code: a dict, else a one-line ConfigError naming
    the file (objects the weights-only loader refuses, a file that is not torch.save's)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError (a refused global), RuntimeError / EOFError (not a torch.save file)
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = (f"it holds a {refused.group(1)} object, which is never unpickled (no code from a checkpoint runs)"
               if refused else f"{type(e).__name__}: {_one_line(e)}")
        raise ConfigError(f"cannot load {path}: {why}") from None
    if not isinstance(state, dict):
        raise ConfigError(f"{path} is not a saved state (a {type(state).__name__}, not a dict)")
    return state


@contextlib.contextmanager
def malformed(path: Path):
    """Turns a state of the wrong shape (a missing key, a value of the wrong type) met while restoring from `path`
    into a one-line ConfigError naming the file."""
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {_one_line(e)}"
        raise ConfigError(f"{path} does not hold what this run saves ({what}); it was damaged or written by other "
                          "code - resume from another checkpoint") from None
