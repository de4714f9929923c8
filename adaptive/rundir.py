"""The run folder (`--output_dir`): what is in it, when it may be written or cleared, and the run's provenance.

ARTIFACTS is the one table of what a run writes there; everything else (clearing with --overwrite_output_dir, what the
Hub receives, what marks a folder as holding a run) is derived from it. Checkpoint folders have their own layout
(adaptive/checkpoint.py); writing the pipeline is adaptive/export.py, reading one back adaptive/pipelines.py, the Hub
adaptive/hub.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import (MANIFEST, changed_keys, checkpoint_step, describe_changes, incompatible_keys,
                         list_checkpoints, resolve_resume, rotate)
from .config import ConfigError, TrainConfig, read_config
from .secrets import SECRET_FIELDS, scrub_argv
from .faults import check_output_path, writing
from .model_card import redact_paths

# name -> (path in output_dir, uploaded to the Hub, marks a run).  The logs folder is --logging_dir.
ARTIFACTS: dict[str, tuple[str, bool, bool]] = {
    "config": ("config.json", True, True),  # resolved config (the uploaded copy is redacted)
    "run_info": ("run_info.json", False, False),  # world size, versions, commit, command (token scrubbed)
    "stats": ("stats.jsonl", False, True),  # one record per log step / evaluation
    "export_record": ("export.json", False, False),  # {"step", "metrics"} of the exported pipeline; written last
    "model_index": ("model_index.json", True, True),  # DDPMPipeline.save_pretrained
    "unet": ("unet", True, False),
    "scheduler": ("scheduler", True, False),
    "model_card": ("README.md", True, False),
    "samples": ("samples", True, False),  # grid_<step>.png
    "heatmap": ("timestep_p.png", True, False),  # p(t) over training
    "ema_snapshots": ("ema_snapshots", False, False),  # post-hoc EMA snapshots
    "lock": (".lock", False, False),  # flock'ed by the training process for its lifetime; empty, never cleared
}
EXPORT_TMP, EXPORT_OLD = ".export.tmp", ".export.old"  # an export being written; the one it replaces, being swapped


def artifact(out: Path, name: str) -> Path:
    return Path(out) / ARTIFACTS[name][0]


def exported_step(out: Path) -> Optional[int]:
    """The step of the pipeline exported in `out` (its export.json), or None: no export, or a record cut short."""
    try:
        return json.loads(artifact(out, "export_record").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_holds_training(out: Path) -> bool:
    """A folder holds a run if it has any of the marking artifacts or a checkpoint."""
    markers = [path for path, _, marks in ARTIFACTS.values() if marks]
    return out.is_dir() and (any((out / m).exists() for m in markers) or bool(list_checkpoints(out)))


def hub_patterns() -> list[str]:
    """Glob patterns of the artifacts a run publishes (allow_patterns of huggingface_hub's filter_repo_objects)."""
    return [f"{path}/*" if name in ("unet", "scheduler") else f"{path}/*.png" if name == "samples" else path
            for name, (path, hub, _) in ARTIFACTS.items() if hub]


def public_bytes(out: Path, rel: str) -> Optional[bytes]:
    """The published content of the run file `out/rel` where it differs from the local one: a JSON file holding local
    paths (the run's config.json, each checkpoint's - resuming reads their paths, so they stay in the local files) goes
    up with them redacted (`model_card.redact_paths`). None: the file goes up as it is."""
    if not rel.endswith(".json"):
        return None
    try:
        data = json.loads((Path(out) / rel).read_text())
    except ValueError:  # not JSON after all: nothing of ours to redact
        return None
    public = redact_paths(data, Path(out))
    return None if public == data else json.dumps(public, indent=2, sort_keys=True).encode()


# ------------------------------------------------------------------------------------------------ folder policy


def fresh_start_line(cfg: TrainConfig) -> str:
    """The start-up line of a run that does not resume: where it writes, that it starts at step 0, from which preset."""
    out = Path(cfg.output_dir)
    if cfg.overwrite_output_dir and run_holds_training(out):
        return f"--overwrite_output_dir: replacing the run in {out}, starting from step 0 (preset {cfg.preset})"
    return f"no checkpoint in {out}: starting from step 0 (preset {cfg.preset})"


def check_output_dir(cfg: TrainConfig, log) -> Optional[Path]:
    """Decide what to do with output_dir before anything is written; returns the checkpoint to resume from. A run
    left aside by an --overwrite_output_dir run that ended early is resolved first (`resolve_aside`)."""
    out = Path(cfg.output_dir)
    check_output_path(out, "--output_dir")
    check_output_path(out / cfg.logging_dir, "--logging_dir")
    if (out / cfg.logging_dir).resolve() == out.resolve():
        raise ConfigError(f"--logging_dir {cfg.logging_dir!r} is the output folder itself; name a folder inside it "
                          "(default: logs)")
    if out.is_dir():
        resolve_aside(out, log)
    if not run_holds_training(out):
        foreign = foreign_files(out)
        if foreign and not cfg.overwrite_output_dir:
            raise ConfigError(
                f"--output_dir {out} is not a run folder and holds files ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); use a new --output_dir, or --overwrite_output_dir to train "
                "there (only a run's own files are replaced)")
        if cfg.resume_from_checkpoint not in (None, "latest"):
            return resolve_resume(out, cfg.resume_from_checkpoint, log)
        return None
    if cfg.overwrite_output_dir:
        return None
    if not cfg.resume_from_checkpoint:
        raise ConfigError(
            f"--output_dir {out} already holds a run; pass --resume_from_checkpoint latest to continue it or "
            "--overwrite_output_dir to replace it"
        )
    ckpt = resolve_resume(out, cfg.resume_from_checkpoint, log)
    saved_cfg_file = ckpt / "config.json" if ckpt else artifact(out, "config")
    if saved_cfg_file.exists():
        saved = read_config(saved_cfg_file)
        bad = incompatible_keys(saved, cfg.to_dict())
        if bad:
            raise ConfigError(
                f"{saved_cfg_file.parent} was trained with a different model/objective "
                f"({describe_changes(saved, cfg.to_dict(), bad)}), says its {saved_cfg_file.name}; "
                "use another --output_dir or --overwrite_output_dir"
            )
        changed = [k for k in changed_keys(saved, cfg.to_dict())
                   if k != "mixed_precision" or saved.get(k) != cfg.mixed_precision]
        if ckpt and changed:  # every one applies (optimizer hyper-parameters too: build.apply_optimizer_settings)
            log(f"warning: resuming {ckpt.name} with changed settings, which apply from its step on: "
                f"{', '.join(changed)}")
    return ckpt


def foreign_files(out: Path) -> list[str]:
    """Names in `out` other than the lock (sorted): in a folder that holds no run they are someone else's."""
    if not out.is_dir():
        return []
    ours = {ARTIFACTS["lock"][0], ASIDE, ASIDE_PARTIAL}  # README.md, unet/ ... without a run are not a run's
    return sorted(p.name for p in out.iterdir() if p.name not in ours)


def lock_output_dir(out: Path, log):
    """An exclusive lock on the run folder for this process's lifetime (main process; returns the open lock file to
    keep). A second training process on the folder gets a one-line error naming the holder's PID; the OS releases
    the lock when the holder ends, however it ends, so a crash never leaves a stale lock."""
    path = artifact(out, "lock")
    handle = open(path, "a")  # only a handle: the file is never written
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        holder = lock_holder(path)
        raise ConfigError(
            f"--output_dir {out} is in use by another training process "
            f"({f'PID {holder}' if holder else 'PID unknown'});"
            " wait for it to finish or stop it (a killed launcher's ranks may still be running), or use another "
            "--output_dir") from None
    except OSError as e:  # a file system without locks: train on, unprotected
        log(f"warning: cannot lock {path} ({e.strerror}); make sure no other process trains into {out}")
    return handle


def lock_holder(path: Path) -> Optional[int]:
    """The PID holding a flock on `path` (Linux /proc/locks), or None."""
    try:
        st = os.stat(path)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if "FLOCK" in parts and key in parts and "->" not in parts:
                return int(parts[parts.index(key) - 1])
    except (OSError, ValueError):
        pass
    return None


# --overwrite_output_dir moves the replaced run's files into ASIDE_PARTIAL, then renames that to ASIDE (the commit
# point), both inside the output folder (same file system: every move is a rename). The replaced run is deleted only
# once the new run has written its first checkpoint; any end before that puts it back (`restore_aside`), in the
# process or at the next start (`resolve_aside`).
ASIDE, ASIDE_PARTIAL = ".replaced-run", ".replacing-run"
MOVED = ".moved.json"  # in the aside folder: the paths moved, relative to the output folder


def run_files(out: Path, logging_dir: Optional[str] = None) -> list[str]:
    """The run's files present in `out` (paths relative to it): checkpoints, temporary checkpoint folders, the
    ARTIFACTS (the lock excepted) and --logging_dir where it lies inside `out`."""
    out = Path(out)
    paths = [p.name for p in list_checkpoints(out) + sorted(out.glob(".checkpoint-*.tmp"))]
    paths += [path for name, (path, _, _) in ARTIFACTS.items() if name != "lock" and (out / path).exists()]
    if logging_dir is not None:
        logs, root = (out / logging_dir).resolve(), out.resolve()
        if root in logs.parents and logs.exists():
            rel = str(logs.relative_to(root))
            if not any(rel == p or rel.startswith(p + os.sep) for p in paths):
                paths.append(rel)
    return paths


def move_aside(out: Path, logging_dir: str) -> bool:
    """Move the replaced run's files aside (main process, lock held); False when there was nothing to move."""
    paths = run_files(out, logging_dir)
    if not paths:
        return False
    partial = out / ASIDE_PARTIAL
    partial.mkdir()
    (partial / MOVED).write_text(json.dumps(paths))
    for rel in paths:
        (partial / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(out / rel, partial / rel)
    os.rename(partial, out / ASIDE)
    return True


def restore_aside(out: Path) -> bool:
    """Put a replaced run back (main process, lock held): the replacing run's files - it has no checkpoint - are
    removed, the moved ones renamed back. False when nothing was aside."""
    aside = next((out / name for name in (ASIDE, ASIDE_PARTIAL) if (out / name).is_dir()), None)
    if aside is None:
        return False
    try:
        moved = json.loads((aside / MOVED).read_text())
    except (OSError, ValueError):  # killed before the list was written: nothing was moved yet
        moved = []
    if aside.name == ASIDE:  # the replacing run may have written some of its files
        for rel in run_files(out) + [rel for rel in moved if (aside / rel).exists()]:
            target = out / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    for rel in moved:
        if (aside / rel).exists() and not (out / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            os.rename(aside / rel, out / rel)
    shutil.rmtree(aside)
    return True


def discard_aside(out: Path) -> None:
    """The new run wrote its first checkpoint: delete the run it replaced (main process)."""
    if (out / ASIDE).is_dir():
        shutil.rmtree(out / ASIDE)


def resolve_aside(out: Path, log) -> None:
    """At the start: a run left aside by an --overwrite_output_dir run that ended (was killed) before its first
    checkpoint is put back; one left aside by a run that got its checkpoint is deleted. The launcher's rank 0 does it
    under the folder's lock; the other ranks wait for it (at most a minute)."""
    if not ((out / ASIDE).is_dir() or (out / ASIDE_PARTIAL).is_dir()):
        return
    if int(os.environ.get("RANK", "0")) != 0:
        deadline = time.monotonic() + 60
        while ((out / ASIDE).is_dir() or (out / ASIDE_PARTIAL).is_dir()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return
    lock = lock_output_dir(out, log)
    try:
        if (out / ASIDE).is_dir() and list_checkpoints(out):
            discard_aside(out)
            log(f"{out}: deleted the run replaced by --overwrite_output_dir (the new run has its checkpoint)")
        elif restore_aside(out):
            log(f"{out}: restored the run that an --overwrite_output_dir run ended before replacing (it wrote no "
                "checkpoint)")
    finally:
        lock.close()


def set_branch_aside(out: Path, resume_from: Path, log) -> Optional[Path]:
    """Resuming a checkpoint older than the newest of `out` (one of its own, or a copy kept elsewhere) makes it the
    timeline: the newer checkpoints, an export of
    a later step and the stats.jsonl rows after it move into `abandoned-after-<step>/` (kept, not deleted), so
    `latest` can never return to the abandoned branch. Returns that folder (None: nothing newer)."""
    step = saved_step(resume_from)  # a copy kept outside the run (bk/checkpoint-20) branches the run the same way
    if step is None:
        return None
    newer = [c for c in list_checkpoints(out) if checkpoint_step(c) > step]
    export_step = exported_step(out)
    export = [path for name in ("model_index", "unet", "scheduler", "model_card", "export_record")
              for path in [ARTIFACTS[name][0]] if (out / path).exists()] \
        if export_step is not None and export_step > step else []
    if not newer and not export:
        return None
    aside, n = out / f"abandoned-after-{step}", 1
    while aside.exists():
        n += 1
        aside = out / f"abandoned-after-{step}-{n}"
    aside.mkdir()
    for path in [c.name for c in newer] + export:
        os.rename(out / path, aside / path)
    stats = artifact(out, "stats")
    if stats.exists():
        cut = [line for line in stats.read_text().splitlines() if _record_step(line) > step]
        (aside / stats.name).write_text("".join(line + "\n" for line in cut))
    log(f"resuming {resume_from.name}, not the newest: the newer timeline "
        f"({', '.join([c.name for c in newer] + export)}"
        f" and the stats.jsonl rows after step {step}) is moved aside to {aside}")
    return aside


def saved_step(checkpoint: Path) -> Optional[int]:
    """The step a checkpoint was saved at: its manifest's, else its folder name's (checkpoint-<step>)."""
    try:
        step = json.loads((Path(checkpoint) / MANIFEST).read_text()).get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    except (OSError, ValueError, AttributeError):
        pass
    return checkpoint_step(checkpoint)


def _record_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def prepare_for_training(cfg: TrainConfig, resume_from: Optional[Path], log=print) -> bool:
    """Right before training, every check passed (main process, lock held): move a replaced run aside
    (--overwrite_output_dir; deleted at the new run's first checkpoint) or the abandoned branch of a resumed older
    checkpoint (kept), and remove temporary folders of checkpoint writes that were killed or failed. True when a
    replaced run was moved aside."""
    out = Path(cfg.output_dir)
    if resume_from is not None:
        set_branch_aside(out, Path(resume_from), log)
    moved = cfg.overwrite_output_dir and resume_from is None and move_aside(out, cfg.logging_dir)
    rotate(out, None)
    for stale in (EXPORT_TMP, EXPORT_OLD):  # an export killed while being written or swapped in
        shutil.rmtree(out / stale, ignore_errors=True)
    return bool(moved)


# ------------------------------------------------------------------------------------------------ provenance


def run_info(accelerator, cfg: TrainConfig, layout, num_params: int, data) -> dict:
    import accelerate
    import diffusers

    return {
        "command": scrubbed_command(sys.argv, run_secrets(cfg)),
        "world_size": accelerator.num_processes,
        "device": str(accelerator.device),
        "device_name": (torch.cuda.get_device_name() if accelerator.device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "mixed_precision": accelerator.mixed_precision,
        "global_batch": layout.global_batch,
        "num_parameters": num_params,
        "num_images": data.num_images,
        "streaming": data.streaming,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "accelerate": accelerate.__version__, "python": platform.python_version()},
        "git_commit": git_commit(),
    }


def write_run_records(out: Path, cfg: TrainConfig, info: dict, timesteps: dict) -> None:
    """config.json and run_info.json (main process)."""
    with writing("config.json and run_info.json", out):
        write_atomic(artifact(out, "config"), cfg.to_json())
        write_atomic(artifact(out, "run_info"), json.dumps({**info, "sampler": timesteps}, indent=2))


def write_atomic(path: Path, text: str) -> None:
    """`path` holds either its old text or `text`, never a part: written beside it, flushed, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def scrubbed_command(argv: list[str], secrets=()) -> str:
    """The command line with the secrets replaced by *** (scrubbed_argv)."""
    return " ".join(scrubbed_argv(argv, secrets))


def scrubbed_argv(argv: list[str], secrets=()) -> list[str]:
    """argv with every secret hidden (adaptive/secrets.py: secret-looking flags' values, token-shaped strings, and the
    parsed secret values `secrets` - run_secrets - wherever they occur)."""
    return scrub_argv(argv, secrets)


def run_secrets(cfg: TrainConfig) -> list[str]:
    """Secret values of this run: the parsed SECRET_FIELDS and $HF_TOKEN (never written anywhere)."""
    return [v.strip() for v in [*(getattr(cfg, name) for name in SECRET_FIELDS), os.environ.get("HF_TOKEN")]
            if v and v.strip()]


def rerun_command(argv: list[str]) -> str:
    """The command that reruns this run from its latest checkpoint (for a finished run: retries its upload): the same
    flags, token hidden, with --resume_from_checkpoint latest and without --overwrite_output_dir."""
    args, skip = [], False
    for a in scrubbed_argv(argv[1:]):
        if skip:
            skip = False
        elif a == "--resume_from_checkpoint":
            skip = True
        elif a.startswith("--resume_from_checkpoint=") or a in ("--overwrite_output_dir", "--no-overwrite_output_dir"):
            continue
        else:
            args.append(a)
    launched = "TORCHELASTIC_RUN_ID" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ
    launcher = "accelerate launch <the same launch options>" if launched else "python"
    return f"{launcher} {shlex.join([argv[0], *args, '--resume_from_checkpoint', 'latest'])}"


def git_commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except Exception:
        return None


__all__ = ["ARTIFACTS", "EXPORT_OLD", "EXPORT_TMP", "artifact", "check_output_dir", "discard_aside", "exported_step",
           "fresh_start_line", "git_commit", "hub_patterns", "lock_output_dir", "prepare_for_training",
           "public_bytes", "resolve_aside", "restore_aside", "run_files", "rerun_command", "run_holds_training",
           "run_info", "run_secrets", "scrubbed_argv", "scrubbed_command", "write_run_records"]
