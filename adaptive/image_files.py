"""Image sets on disk for scoring: a sample.py output folder, any folder of images, a .zip or an .npz -> an ImageSet
that is validated once (readable, one size) and read as uint8 [N, H, W, 3] chunks."""

from __future__ import annotations

import json
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from .config import ConfigError
from .sources import FolderEntries, ImageEntries, ZipEntries

SAMPLING_RECORD = "sampling.json"  # written by sample.py next to its images/


@dataclass
class ImageSet:
    description: str  # for messages and metrics.json
    size: Optional[tuple[int, int]]  # (H, W) of every image
    entries: Optional[ImageEntries] = None  # folder or zip members, in the order used
    array: Optional[np.ndarray] = None  # uint8 [N, H, W, 3] when not read from files
    sampling: dict = field(default_factory=dict)  # sample.py's sampling.json, when the images come with one
    source: Optional[Path] = None  # the folder / zip / npz

    def __len__(self) -> int:
        return len(self.entries) if self.entries is not None else len(self.array)

    def chunks(self, size: int = 1000) -> Iterator[np.ndarray]:
        """uint8 [<=size, H, W, 3] in order."""
        for start in range(0, len(self), size):
            if self.array is not None:
                yield self.array[start : start + size]
            else:
                idx = range(start, min(len(self), start + size))
                with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
                    yield np.stack(list(pool.map(lambda i: np.asarray(self.entries.open(i)), idx)))


def open_images(path: str, flag: str, num: Optional[int] = None) -> ImageSet:
    """Folder / zip / npz -> an ImageSet of its first `num` images (all when None), each decoded once to check it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{flag} {p} does not exist")
    sampling = {}
    if p.is_dir() and (p / "images").is_dir() and (p / SAMPLING_RECORD).is_file():  # a sample.py output_dir
        sampling, p = read_json(p / SAMPLING_RECORD), p / "images"
    if p.suffix == ".npz":
        sampling = read_json(p.parent / SAMPLING_RECORD) if (p.parent / SAMPLING_RECORD).is_file() else {}
        array = load_npz_images(p)
        n = first_n(len(array), num, f"{flag} {p}")
        return ImageSet(f"{p}", tuple(array.shape[1:3]), array=array[:n], sampling=sampling, source=p)
    entries = path_entries(p, flag)
    n = first_n(len(entries), num, f"{flag} {entries.description}")
    if isinstance(entries, FolderEntries):
        entries.files = entries.files[:n]
    else:
        entries.names = entries.names[:n]
    return ImageSet(entries.description, check_sizes(entries), entries=entries, sampling=sampling, source=p)


def path_entries(p: Path, flag: str) -> ImageEntries:
    """Undecoded images of a folder (searched recursively) or a .zip."""
    if p.is_dir():
        return FolderEntries(p)
    if zipfile.is_zipfile(p):
        return ZipEntries(p)
    raise ConfigError(f"{flag} {p} is neither a folder, a .zip of images nor an .npz")


def first_n(count: int, num: Optional[int], what: str) -> int:
    if count == 0:
        raise ConfigError(f"no images in {what} (expected .png/.jpg/.jpeg/.bmp/... files)")
    if num is None:
        return count
    if count < num:
        raise ConfigError(f"{what} holds {count} images, fewer than the {num} requested")
    return num


def load_npz_images(p: Path) -> np.ndarray:
    try:
        with np.load(p, allow_pickle=False) as z:
            if "arr_0" not in z.files:
                raise ConfigError(f"{p} has no 'arr_0' array (expected uint8 [N, H, W, 3])")
            array = z["arr_0"]
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {p} ({e})") from None
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ConfigError(f"{p}: arr_0 is {array.dtype} {list(array.shape)}, expected uint8 [N, H, W, 3]")
    return array


def check_sizes(entries: ImageEntries) -> tuple[int, int]:
    """Decode every image once (unreadable -> error naming it); all must share one size (else name two)."""
    def size_of(i):
        w, h = entries.open(i).size
        return h, w

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        sizes = list(pool.map(size_of, range(len(entries)), chunksize=64))
    odd = next((i for i, s in enumerate(sizes) if s != sizes[0]), None)
    if odd is not None:
        raise ConfigError(f"mixed image sizes in {entries.description}: {entries.name(0)} is {fmt_size(sizes[0])}, "
                          f"{entries.name(odd)} is {fmt_size(sizes[odd])}")
    return sizes[0]


def fmt_size(hw) -> str:
    return f"{hw[1]}x{hw[0]}"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
