"""Data decoded once: the uint8 array that `data.decode_all` makes of an image source (every image decoded and
resized to the training resolution) is kept under `<cache_dir>/decoded/`, keyed by the source's content
(`ImageEntries.content_key`: a zip's sha256, a folder's file names, sizes and modification times, a Hub dataset's
fingerprint), the resolution and the number of images. A second start on the same data loads it instead of decoding
(CIFAR-10's 50,000 JPEGs: docs/performance.md). A cache that cannot be read is decoded again and rewritten; one that
cannot be written is skipped with a warning: the cache never stops a run.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .fid import file_sha256  # noqa: F401  (ImageEntries.content_key of a zip: the project's one file hash)


def cache_path(cache_dir: Path, key: str, resolution: int, n: int) -> Path:
    return Path(cache_dir) / "decoded" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}-{resolution}px-{n}.npy"


def load(path: Path, n: int) -> Optional[torch.Tensor]:
    """The cached uint8 [n, 3, s, s] images, or None when there is none or it is not what it should be."""
    if not path.is_file():
        return None
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[0] != n or array.shape[1] != 3:
        return None
    return torch.from_numpy(array)


def save(path: Path, images: torch.Tensor, warn: Callable[[str], None] = print) -> None:
    """Write atomically through a temporary file of this writer's own (ranks and parallel runs may write the same
    entry at once: the last complete file wins); a failure is a warning."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp.npy")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, images.numpy(), allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:  # never created (e.g. the cache folder cannot exist)
            pass
        warn(f"warning: the decoded images could not be cached in {path.parent} ({e.strerror or e}); the next start "
             "decodes them again")
