"""The configured image source (adaptive/sources.py) -> one uint8 tensor on the device -> batches made there.

Sources (adaptive/sources.py): `--train_data_dir` (a folder or .zip of images), `--dataset_name cifar10`
(torchvision), or any Hub dataset with an image column (`datasets`). Images are decoded once; every batch is a
gather + optional resize + flip on the device, so the hot loop does no per-sample Python or PIL work. Datasets
larger than `--max_resident_gb` stream from disk through a DataLoader that follows the same index schedule.

The index schedule makes data order a pure function of (seed, step, micro-step, rank): global sample position
p = ((step * accum + micro) * world + rank) * B + i walks through per-epoch permutations. The global batch of an
optimizer step is therefore the same for any split over processes and accumulation steps, and resuming needs no
skipping through a loader.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F

from . import decoded_cache
from .config import ConfigError, TrainConfig
from .progress import progress
from .seeding import seed_for
from .sources import ImageEntries, default_cache_dir, open_source

# ----------------------------------------------------------------------------------------------------------------
# The configured source (adaptive/sources.py).


def open_entries(cfg: TrainConfig, flag: str = "--train_data_dir",
                 dataset_flag: str = "--dataset_name") -> ImageEntries:
    """The configured source as ImageEntries (adaptive/sources.py: the registry of sources); raises ConfigError with
    a one-line reason (naming `flag` / `dataset_flag`, the flags that gave cfg.train_data_dir / cfg.dataset_name)."""
    return open_source(cfg, flag, dataset_flag)


# ----------------------------------------------------------------------------------------------------------------
# Decoding to a uint8 tensor.


def resize_uint8(x: torch.Tensor, size: int) -> torch.Tensor:
    """[N, 3, H, W] uint8 -> [N, 3, size, size] uint8: shorter side to `size` (bilinear, antialias), centre crop."""
    n, c, h, w = x.shape
    if h == w == size:
        return x
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    y = F.interpolate(x.float(), size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    top, left = (nh - size) // 2, (nw - size) // 2
    return y[:, :, top : top + size, left : left + size].round().clamp(0, 255).to(torch.uint8)


def _to_chw(img) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def storage_size(first_image_hw: tuple[int, int], resolution: int) -> int:
    """Side at which images are stored: a square source up to 2x the resolution keeps its own size (and is resized on
    the device per batch: bilinear + antialias on [0, 255] floats, exactly the benchmark protocol's pipeline);
    anything else is resized and centre-cropped to the resolution once, at decode time."""
    h, w = first_image_hw
    return h if h == w and resolution <= h <= 2 * resolution else resolution


def decode_image(entries: ImageEntries, i: int, size: Optional[int], resolution: int) -> torch.Tensor:
    """Image i as uint8 [3, size, size]; `size` None = decide from this image (see storage_size)."""
    x = _to_chw(entries.open(i))
    size = size or storage_size(tuple(x.shape[1:]), resolution)
    return resize_uint8(x[None], size)[0]


def decode_all(entries: ImageEntries, resolution: int, limit: Optional[int] = None, threads: int = 0,
               label: Optional[str] = None, cache_dir: Optional[Path] = None,
               log: Callable[[str], None] = print) -> torch.Tensor:
    """Decode every image once into uint8 [N, 3, s, s] on the CPU (s from `storage_size` of the first image). With a
    `label`: progress under that name (adaptive/progress.py: a bar on a terminal, else lines) once decoding has
    taken a second. With a `cache_dir`: loaded from, else saved to, the decoded cache (adaptive/decoded_cache.py)."""
    return decode_or_load(entries, resolution, limit, threads, label, cache_dir, log)[0]


def decode_or_load(entries: ImageEntries, resolution: int, limit: Optional[int] = None, threads: int = 0,
                   label: Optional[str] = None, cache_dir: Optional[Path] = None,
                   log: Callable[[str], None] = print) -> tuple[torch.Tensor, bool]:
    """decode_all, and whether the images came from the decoded cache."""
    n = len(entries) if limit is None else min(limit, len(entries))
    key = entries.content_key() if cache_dir is not None and n else None
    path = decoded_cache.cache_path(cache_dir, key, resolution, n) if key else None
    cached = decoded_cache.load(path, n) if path else None
    if cached is not None:
        return cached, True
    images = _decode(entries, resolution, n, threads, label)
    if path is not None:
        decoded_cache.save(path, images, log)
    return images, False


def _decode(entries: ImageEntries, resolution: int, n: int, threads: int, label: Optional[str]):
    """decode_all without its cache."""
    if n == 0:
        raise ConfigError(f"no images in {entries.description}")
    first = decode_image(entries, 0, None, resolution)
    size = first.shape[-1]
    threads = threads or min(8, os.cpu_count() or 1)
    bar = progress(n, label or "", "img", enabled=bool(label))
    bar.update(1)
    with ThreadPoolExecutor(threads) as pool, bar:
        rest = []
        for image in pool.map(lambda i: decode_image(entries, i, size, resolution), range(1, n)):
            rest.append(image)
            bar.update()
    return torch.stack([first, *rest])


# ----------------------------------------------------------------------------------------------------------------
# The index schedule and on-device batches.


@dataclass
class Layout:
    """How one optimizer step's global batch is split: B per device, `world` processes, `accum` micro-steps."""

    batch_size: int
    world_size: int = 1
    accum: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accum

    def offset(self, step: int, micro: int, rank: int) -> int:
        """First global sample position of (step, micro, rank)."""
        return ((step * self.accum + micro) * self.world_size + rank) * self.batch_size

    def slice(self, micro: int, rank: int) -> slice:
        """This (micro, rank)'s part of a per-optimizer-step global tensor ordered (micro, rank, i)."""
        start = (micro * self.world_size + rank) * self.batch_size
        return slice(start, start + self.batch_size)


class IndexSchedule:
    """Sample position -> (dataset index, flip bit) through per-epoch permutations seeded by (seed, epoch)."""

    def __init__(self, num_images: int, seed: int, device: torch.device | str = "cpu"):
        self.n, self.seed, self.device = num_images, seed, torch.device(device)
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def epoch_tables(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if epoch not in self._cache:
            g = torch.Generator().manual_seed(seed_for(self.seed, "data", epoch))
            perm = torch.randperm(self.n, generator=g)
            flips = torch.randint(0, 2, (self.n,), generator=g, dtype=torch.uint8).bool()
            self._cache = {k: v for k, v in self._cache.items() if k >= epoch - 1}  # keep at most two epochs
            self._cache[epoch] = (perm.to(self.device), flips.to(self.device))
        return self._cache[epoch]

    def lookup(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices [count], flips [count]) for global positions start .. start+count-1."""
        idx, flip = [], []
        pos, left = start, count
        while left > 0:
            epoch, off = divmod(pos, self.n)
            take = min(left, self.n - off)
            perm, flips = self.epoch_tables(epoch)
            idx.append(perm[off : off + take])
            flip.append(flips[off : off + take])
            pos, left = pos + take, left - take
        return (idx[0], flip[0]) if len(idx) == 1 else (torch.cat(idx), torch.cat(flip))


def to_model_input(x_uint8: torch.Tensor, flip: Optional[torch.Tensor], resolution: int) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float [B, 3, S, S] in [-1, 1]: resize on [0, 255] floats, flip, scale."""
    x = x_uint8.float()
    if x.shape[-1] != resolution or x.shape[-2] != resolution:
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", antialias=True, align_corners=False)
    if flip is not None:
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x / 127.5 - 1.0


class TrainData:
    """Batches for one rank: `batches(start_step)` yields, per optimizer step, the list of its micro-batches."""

    def __init__(self, cfg: TrainConfig, layout: Layout, rank: int, device: torch.device,
                 images: Optional[torch.Tensor] = None, entries: Optional[ImageEntries] = None):
        self.cfg, self.layout, self.rank, self.device = cfg, layout, rank, device
        self.images = images  # uint8 [N, 3, H, W], resident; None when streaming
        self.entries = entries  # used when streaming
        n = len(images) if images is not None else len(entries)
        if cfg.max_train_samples is not None:
            n = min(n, cfg.max_train_samples)
        self.num_images = n
        table_device = images.device if images is not None else torch.device("cpu")
        self.schedule = IndexSchedule(n, cfg.seed, table_device)

    @property
    def streaming(self) -> bool:
        return self.images is None

    def indices(self, step: int, micro: int, rank: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        rank = self.rank if rank is None else rank
        idx, flip = self.schedule.lookup(self.layout.offset(step, micro, rank), self.layout.batch_size)
        return idx, (flip if self.cfg.random_flip else torch.zeros_like(flip))

    def batch(self, step: int, micro: int) -> torch.Tensor:
        """float [B, 3, S, S] in [-1, 1] on the device (resident data only)."""
        idx, flip = self.indices(step, micro)
        x = self.images[idx].to(self.device, non_blocking=True)
        return to_model_input(x, flip.to(self.device, non_blocking=True), self.cfg.resolution)

    def batches(self, start_step: int) -> Iterator[list[torch.Tensor]]:
        if self.streaming:
            yield from self._stream(start_step)
            return
        step = start_step
        while True:
            yield [self.batch(step, a) for a in range(self.layout.accum)]
            step += 1

    def _stream(self, start_step: int) -> Iterator[list[torch.Tensor]]:
        loader = torch.utils.data.DataLoader(
            _StreamingDataset(self.entries, self.cfg.resolution),
            batch_sampler=_ScheduledBatches(self, start_step),
            num_workers=self.cfg.dataloader_num_workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=False,
            prefetch_factor=4 if self.cfg.dataloader_num_workers > 0 else None,
        )
        step, micro, group = start_step, 0, []
        for x in loader:
            _, flip = self.indices(step, micro)
            group.append(to_model_input(x.to(self.device, non_blocking=True), flip.to(self.device),
                                        self.cfg.resolution))
            micro += 1
            if micro == self.layout.accum:
                yield group
                step, micro, group = step + 1, 0, []


class _StreamingDataset(torch.utils.data.Dataset):
    """Decodes on demand at the storage size decided from the first image, as decode_all does."""

    def __init__(self, entries: ImageEntries, resolution: int):
        self.entries, self.resolution = entries, resolution
        self.size = decode_image(entries, 0, None, resolution).shape[-1]

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        return decode_image(self.entries, int(i), self.size, self.resolution)


class _ScheduledBatches:
    """Batch sampler yielding this rank's index lists in (step, micro) order from `start_step` on."""

    def __init__(self, data: TrainData, start_step: int):
        self.data, self.start_step = data, start_step

    def __iter__(self):
        step = self.start_step
        while True:
            for a in range(self.data.layout.accum):
                yield self.data.indices(step, a)[0].tolist()
            step += 1


def load_train_data(cfg: TrainConfig, layout: Layout, rank: int, device: torch.device,
                    entries: Optional[ImageEntries] = None, log: Callable[[str], None] = print) -> TrainData:
    """Decide resident vs streaming, decode once, move to the data device."""
    entries = entries if entries is not None else open_entries(cfg)
    n = len(entries) if cfg.max_train_samples is None else min(cfg.max_train_samples, len(entries))
    resident_bytes = n * 3 * cfg.resolution**2
    if resident_bytes > cfg.max_resident_gb * 2**30:
        log(f"data: {n} images from {entries.description} ({resident_bytes / 2**30:.1f} GiB > --max_resident_gb "
            f"{cfg.max_resident_gb}): streaming with {cfg.dataloader_num_workers} workers")
        return TrainData(cfg, layout, rank, device, entries=entries)
    t0 = time.perf_counter()
    label = f"data: decoding {entries.description}" if rank == 0 else None
    images, cached = decode_or_load(entries, cfg.resolution, limit=n, label=label,
                                    cache_dir=default_cache_dir(cfg.cache_dir), log=log)
    data_device = device if cfg.data_device == "auto" else torch.device("cpu")
    images = images.to(data_device)
    how = "loaded from the decoded cache" if cached else "decoded"
    log(f"data: {n} images from {entries.description}, uint8 {tuple(images.shape[1:])} resident on {data_device} "
        f"({how} in {time.perf_counter() - t0:.1f} s)")
    return TrainData(cfg, layout, rank, device, images=images)
