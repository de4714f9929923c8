"""Faults a run reports as one line and a distinct exit status instead of a traceback, and how ranks agree on them.

Exit status of train_accelerate.py: 0 done or stopped by a signal / the budget (checkpoint written), 2 bad input
(nothing touched), 3 the final Hub upload failed (adaptive/hub.py), 4 training diverged (a non-finite loss, gradient
norm or weights; nothing saved from them), 5 the disk is full (the partial write removed, the previous checkpoint
intact), 6 this rank lost a peer (it ended, or stopped for longer than --ddp_timeout_minutes), 7 a launch that did not
form one process group or asked for GPUs on a host without one; 128 + the signal number: stopped during a Hub
download (adaptive/hub_wait.py), nothing written. Every rank raises the same fault at the same point (`agree`), and
only the launcher's rank 0 prints it; a lost peer is reported by the rank that saw it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from .config import ConfigError


class LaunchError(ConfigError):
    """The launched processes did not join one process group, or were launched for GPUs the host does not have."""

    exit_code = 7


class Diverged(ConfigError):
    """A non-finite loss, gradient norm or weights."""

    exit_code = 4


class DiskFull(ConfigError):
    """No space left on the device while writing a run's file."""

    exit_code = 5


class PeerLost(ConfigError):
    """A collective failed because another rank ended or stopped responding."""

    exit_code = 6


class Interrupted(ConfigError):
    """A stop signal during a wait that has nothing to checkpoint (a Hub download): exit 128 + the signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


LATER_RANKS_EXIT_AFTER_S = 2.0  # a failing launch: the other ranks end this much after rank 0 has printed its line


def run_cli(prog: str, body: Callable[[], int]) -> int:
    """Runs a command-line tool: a ConfigError (bad input or a fault above) is one line `<prog>: error: ...` on
    stderr and its exit code, said once by the launcher's rank 0 (every rank raises the same)."""
    try:
        return body()
    except ConfigError as e:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{prog}: error: {e}", file=sys.stderr)
        tell_launcher(f"{prog}: error: {e}")
        if int(os.environ.get("RANK", "0")) != 0:  # rank 0 says it: torchrun would kill it when the first rank ends
            time.sleep(LATER_RANKS_EXIT_AFTER_S)
        return e.exit_code


def tell_launcher(line: str) -> None:
    """Under torchrun (`accelerate launch` with several processes) the one-line error becomes this rank's entry in
    the launcher's failure summary (its TORCHELASTIC_ERROR_FILE), instead of "To enable traceback see: ..."."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": line, "timestamp": int(time.time())}, f)
    except OSError:  # the summary is a courtesy: the line itself is already on stderr
        pass


def check_launch() -> None:
    """LaunchError (one line) when `accelerate launch` started several processes for GPUs (a MULTI_GPU, FSDP or
    multi-node config, ACCELERATE_USE_CPU unset) on a host where torch sees no GPU: every rank stops before it
    decodes data or builds a model, instead of N CPU processes each training a copy."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched <= 1 or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes", "y", "on"):
        return
    import torch

    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return
    raise LaunchError(f"the accelerate config launched {launched} processes for GPUs, but torch sees no GPU on this "
                      "host; on CPUs: ACCELERATE_USE_CPU=1 accelerate launch --config_file "
                      "accelerate_configs/cpu_2proc.yaml ..., or one process: python train_accelerate.py ...")


def check_output_path(path: Path, flag: str, folder: bool = True) -> None:
    """ConfigError (one line) unless `path` can be written as a folder (or, folder=False, a file): no name component
    over 255 bytes, not the other kind of entry, its nearest existing parent a writable folder in which an entry can
    really be created (tried with an empty temporary folder, removed at once: permission bits do not tell, e.g. for
    root in /proc)."""
    path = Path(path).expanduser()
    long = [part for part in path.parts if len(os.fsencode(part)) > 255]
    if long:
        raise ConfigError(f"{flag} {str(path)[:60]}...: a name in the path is {len(os.fsencode(long[0]))} bytes long, "
                          "over the file system's 255")
    if path.exists() and path.is_dir() != folder:
        raise ConfigError(f"{flag} {path} exists and is {'not a folder' if folder else 'a folder, not a file'}")
    parent = path if path.is_dir() else path.parent  # an existing file (folder=False) is replaced in its folder
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {parent} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=parent))
    except OSError as e:
        raise ConfigError(f"{flag} {path}: nothing can be created in {parent} ({e.strerror or e})") from None


def lost_peer(exc: BaseException) -> Optional[PeerLost]:
    """The one-line PeerLost for a collective (gloo / NCCL) that failed because another rank ended or stopped
    responding, or None for anything else."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    text = str(exc)
    if not (isinstance(exc, getattr(dist, "DistError", ())) or "gloo" in text or "NCCL" in text):
        return None
    if any(m in text for m in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")):
        what = "another rank ended (it crashed, was killed or reported its own error)"
    elif "timed out" in text.lower() or "timeout" in text.lower():
        what = "a collective timed out: another rank stopped or hung for longer than --ddp_timeout_minutes"
    else:
        return None
    return PeerLost(f"rank {dist.get_rank()}: {what}; rerun the same command with --resume_from_checkpoint latest")


def out_of_memory(exc: BaseException) -> Optional[ConfigError]:
    """The one-line ConfigError (exit 2: a setting too large for this machine) for an allocation that failed - CPU or
    GPU, in torch or in Python - or None for anything else."""
    for e in _chain(exc):
        text = str(e)
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text \
                or "CUDA out of memory" in text:
            asked = re.search(r"tried to allocate [0-9.]+ ?[A-Za-z]+", text)
            return ConfigError(f"out of memory{f' ({asked.group(0)})' if asked else ''}: lower --train_batch_size "
                               "(--gradient_accumulation_steps keeps the global batch) or --resolution; the "
                               "checkpoints are intact")
    return None


# How a full disk surfaces: errno from Python's own writes, the message from safetensors (Rust), and torch.save's
# stream error (no errno survives it, so there the free space decides).
_FULL_MESSAGES = ("No space left on device", "StorageFull", "Disk quota exceeded")
_STREAM_MESSAGES = ("file write failed", "iostream error", "unexpected pos")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether `exc`, raised while writing under `folder`, means that its file system is full."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(m in str(e) for m in _FULL_MESSAGES):
            return True
    if any(m in str(e) for e in _chain(exc) for m in _STREAM_MESSAGES):
        return free_bytes(folder) < 1 << 20
    return False


def free_bytes(folder: Path) -> int:
    """Bytes available to this user on the file system of `folder` (or of its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 1 << 62


@contextmanager
def writing(what: str, folder: Path, after: str = ""):
    """Turns a full disk while writing `what` under `folder` into a one-line DiskFull; other errors pass through."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e, folder):
            raise
        raise DiskFull(f"disk full: no space left on the device of {folder} while writing {what}"
                       f"{'; ' + after if after else ''}; free some space and rerun the same command with "
                       "--resume_from_checkpoint latest") from None


def agree(accelerator, error: Optional[BaseException]) -> None:
    """Every rank calls this with what it failed with (or None); if any rank failed, every rank raises: its own
    error, or else the first failed rank's. So all ranks stop at the same point and none waits for a peer that has
    gone. One collective when world > 1."""
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        sent = None if error is None else error if isinstance(error, ConfigError) else \
            RuntimeError(f"rank {accelerator.process_index} failed: {type(error).__name__}: {error}")
        first = next((e for e in gather_object([sent]) if e is not None), None)
        if error is None and first is not None:
            raise first
    if error is not None:
        raise error  # this rank's own (with its traceback if it is a bug)
