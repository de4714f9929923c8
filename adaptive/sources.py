"""Where training images come from: undecoded image collections with random access (`ImageEntries`) and the
registry of sources that make them from the config - one class per source, the first that claims the config opens
it. A new source (a database, a WebDataset shard list...) is one `Source` subclass appended to `SOURCES`.

Sources: `--train_data_dir` (a folder of images, class subfolders allowed, or a .zip of one), `--dataset_name cifar10`
(torchvision), or any Hub dataset with an image column (`datasets`).
"""

from __future__ import annotations

import io
import os
import socket
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from . import decoded_cache
from .config import ConfigError, TrainConfig
from .hub_wait import hub_wait

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")


def default_cache_dir(cache_dir: Optional[str] = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return Path(base) / "adaptive-diffusion"


class ImageEntries:
    """Random access to undecoded images: `len`, `name(i)`, `open(i) -> PIL.Image` (RGB)."""

    description: str = ""

    def __len__(self) -> int:
        raise NotImplementedError

    def name(self, i: int) -> str:
        return f"#{i}"

    def open(self, i: int):
        raise NotImplementedError

    def content_key(self) -> Optional[str]:
        """A string that changes whenever the images do (adaptive/decoded_cache.py), or None: not cached."""
        return None


def _decode_bytes(data: bytes, name: str, where: str):
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
        return img.convert("RGB")
    except Exception as e:  # PIL raises many types for corrupt data
        raise ConfigError(f"cannot read image {name!r} in {where}: {type(e).__name__}: {e}") from None


class FolderEntries(ImageEntries):
    def __init__(self, root: Path):
        self.root = root
        self.files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        self.description = f"folder {root}"

    def __len__(self):
        return len(self.files)

    def name(self, i):
        return str(self.files[i].relative_to(self.root))

    def content_key(self):
        import hashlib

        h = hashlib.sha256()
        for p in self.files:
            st = p.stat()
            h.update(f"{p.relative_to(self.root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return f"folder:{h.hexdigest()}"

    def open(self, i):
        try:
            data = self.files[i].read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read {self.files[i]}: {e.strerror}") from None
        return _decode_bytes(data, self.name(i), self.description)


class ZipEntries(ImageEntries):
    def __init__(self, path: Path):
        self.path = path
        try:
            with zipfile.ZipFile(path) as z:
                self.names = sorted(
                    n for n in z.namelist() if not n.endswith("/") and n.lower().endswith(IMAGE_EXTENSIONS)
                    and not os.path.basename(n).startswith("._")
                )
        except (zipfile.BadZipFile, OSError) as e:
            raise ConfigError(f"--train_data_dir {path} is not a readable zip file ({e})") from None
        self.description = f"zip {path}"
        self._zip = None  # opened lazily, once per process / worker

    def __getstate__(self):
        return {**self.__dict__, "_zip": None}

    def __len__(self):
        return len(self.names)

    def name(self, i):
        return self.names[i]

    def content_key(self):
        return f"zip:{decoded_cache.file_sha256(self.path)}"

    def open(self, i):
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path)
        try:
            data = self._zip.read(self.names[i])
        except (zipfile.BadZipFile, OSError, KeyError) as e:
            raise ConfigError(f"cannot read {self.names[i]!r} in {self.description}: {e}") from None
        return _decode_bytes(data, self.names[i], self.description)


class HubEntries(ImageEntries):
    def __init__(self, dataset, column: str, description: str):
        self.dataset, self.column, self.description = dataset, column, description

    def __len__(self):
        return len(self.dataset)

    def content_key(self):
        fingerprint = getattr(self.dataset, "_fingerprint", None)  # datasets' own content hash of the table
        return f"hub:{fingerprint}:{self.column}" if fingerprint else None

    def open(self, i):
        img = self.dataset[i][self.column]
        if isinstance(img, dict) and "bytes" in img:
            return _decode_bytes(img["bytes"], f"row {i}", self.description)
        return img.convert("RGB")


class ArrayEntries(ImageEntries):
    """Already decoded uint8 images [N, H, W, 3] (torchvision CIFAR-10)."""

    def __init__(self, array: np.ndarray, description: str):
        self.array, self.description = array, description

    def __len__(self):
        return len(self.array)

    def content_key(self):
        import hashlib

        return f"array:{hashlib.sha256(np.ascontiguousarray(self.array).data).hexdigest()}"

    def open(self, i):
        from PIL import Image

        return Image.fromarray(self.array[i])


# ----------------------------------------------------------------------------------------------------------------
# The sources: which one a config names, and how it opens.


class Source:
    """One place images come from: `claims(cfg)` says whether the config names it, `open(cfg, flag, dataset_flag)`
    returns its ImageEntries or raises a one-line ConfigError naming the flag that gave it."""

    name = ""

    @staticmethod
    def claims(cfg: TrainConfig) -> bool:
        raise NotImplementedError

    @staticmethod
    def open(cfg: TrainConfig, flag: str, dataset_flag: str) -> ImageEntries:
        raise NotImplementedError


class LocalImages(Source):
    """--train_data_dir: a folder of images (class subfolders allowed) or a .zip of one."""

    name = "local folder or zip"

    @staticmethod
    def claims(cfg: TrainConfig) -> bool:
        return bool(cfg.train_data_dir)

    @staticmethod
    def open(cfg: TrainConfig, flag: str, dataset_flag: str) -> ImageEntries:
        path = Path(cfg.train_data_dir).expanduser()
        if not path.exists():
            raise ConfigError(f"{flag} {path} does not exist")
        if path.is_dir():
            entries: ImageEntries = FolderEntries(path)
        elif zipfile.is_zipfile(path):
            entries = ZipEntries(path)
        else:
            raise ConfigError(f"{flag} {path} is neither a folder nor a .zip of images")
        if len(entries) == 0:
            raise ConfigError(
                f"no images in {entries.description} (expected {'/'.join(e[1:] for e in IMAGE_EXTENSIONS[:4])} "
                "files, optionally in class subfolders)"
            )
        return entries


class TorchvisionCifar10(Source):
    """--dataset_name cifar10: torchvision's CIFAR-10 training set (downloaded into the cache when online)."""

    name = "CIFAR-10 (torchvision)"

    @staticmethod
    def claims(cfg: TrainConfig) -> bool:
        return bool(cfg.dataset_name) and cfg.dataset_name.lower() in ("cifar10", "cifar-10")

    @staticmethod
    def open(cfg: TrainConfig, flag: str, dataset_flag: str) -> ImageEntries:
        return _cifar10_entries(cfg)


class HubDataset(Source):
    """--dataset_name NAME: a Hub dataset with an image column (`datasets.load_dataset`)."""

    name = "Hub dataset"

    @staticmethod
    def claims(cfg: TrainConfig) -> bool:
        return bool(cfg.dataset_name)

    @staticmethod
    def open(cfg: TrainConfig, flag: str, dataset_flag: str) -> ImageEntries:
        return _hub_entries(cfg, dataset_flag)


SOURCES: list[type[Source]] = [LocalImages, TorchvisionCifar10, HubDataset]  # the first that claims a config opens it


def open_source(cfg: TrainConfig, flag: str = "--train_data_dir", dataset_flag: str = "--dataset_name") -> ImageEntries:
    """The configured source as ImageEntries (the first of SOURCES that claims the config); a one-line ConfigError
    naming `flag` / `dataset_flag` (the flags that gave cfg.train_data_dir / cfg.dataset_name) when it cannot."""
    source = next((s for s in SOURCES if s.claims(cfg)), None)
    if source is None:
        raise ConfigError("no data: give --train_data_dir (folder or .zip of images) or --dataset_name")
    return source.open(cfg, flag, dataset_flag)


def _cifar10_entries(cfg: TrainConfig) -> ImageEntries:
    import torchvision

    root = default_cache_dir(cfg.cache_dir) / "cifar10"
    try:
        ds = torchvision.datasets.CIFAR10(root=str(root), train=True, download=False)
    except RuntimeError:
        old = socket.getdefaulttimeout()
        socket.setdefaulttimeout(20)
        try:
            ds = torchvision.datasets.CIFAR10(root=str(root), train=True, download=True)
        except Exception as e:
            raise ConfigError(
                f"CIFAR-10 is not in {root} and could not be downloaded ({type(e).__name__}); offline, pass "
                "--train_data_dir with a folder or .zip of the images, or put torchvision's cifar-10-batches-py "
                f"folder in {root}"
            ) from None
        finally:
            socket.setdefaulttimeout(old)
    return ArrayEntries(np.asarray(ds.data), f"CIFAR-10 train (torchvision, {root})")


def _hub_entries(cfg: TrainConfig, flag: str) -> ImageEntries:
    try:
        import datasets
    except ImportError:  # pragma: no cover - declared dependency
        raise ConfigError(f"{flag} needs the 'datasets' package") from None
    try:
        with hub_wait(flag, cfg.dataset_name):
            ds = datasets.load_dataset(cfg.dataset_name, cfg.dataset_config_name, cache_dir=cfg.cache_dir,
                                       split="train")
    except ConfigError:
        raise
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"cannot load Hub dataset {cfg.dataset_name!r}: {msg}") from None
    column = cfg.image_column
    if column is None:
        column = next((c for c in ("image", "img") if c in ds.column_names), None)
        if column is None:
            raise ConfigError(
                f"dataset {cfg.dataset_name!r} has no 'image' or 'img' column (columns: {', '.join(ds.column_names)}); "
                "pass --image_column"
            )
    elif column not in ds.column_names:
        raise ConfigError(f"--image_column {column!r} is not a column of {cfg.dataset_name!r} "
                          f"({', '.join(ds.column_names)})")
    return HubEntries(ds, column, f"Hub dataset {cfg.dataset_name}")
