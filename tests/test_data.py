"""Data loading: sources, the index schedule's invariances, the protocol's resize, and bad input."""

from __future__ import annotations

import sys
import zipfile

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from adaptive.config import ConfigError, PRESETS, TrainConfig, replace
from adaptive.data import ImageEntries, IndexSchedule, Layout, TrainData, decode_all, open_entries, to_model_input

from conftest import write_images, zip_folder


def cfg_for(data, **kw) -> TrainConfig:
    return TrainConfig(**{**PRESETS["cpu-tiny16"], "train_data_dir": str(data), "train_batch_size": 4, **kw})


def test_zip_and_folder_decode_to_the_same_tensor(image_folder, image_zip):
    a = decode_all(open_entries(cfg_for(image_folder)), 16)
    b = decode_all(open_entries(cfg_for(image_zip)), 16)
    assert a.dtype == torch.uint8 and a.shape == (24, 3, 32, 32)  # kept at 32 px: resized on the device per batch
    assert torch.equal(a, b)


def test_non_square_images_are_resized_and_cropped_at_decode(tmp_path):
    from PIL import Image

    (tmp_path / "x").mkdir()
    Image.new("RGB", (48, 24), (10, 200, 30)).save(tmp_path / "x" / "a.png")
    Image.new("RGB", (20, 40), (250, 0, 0)).save(tmp_path / "x" / "b.jpg")
    imgs = decode_all(open_entries(cfg_for(tmp_path)), 16)
    assert imgs.shape == (2, 3, 16, 16)
    assert imgs[0, :, 8, 8].tolist() == [10, 200, 30]


def test_batches_follow_the_benchmark_protocols_pipeline(image_folder):
    """uint8 32 px -> bilinear+antialias on [0,255] floats -> 16 px -> [-1, 1] (PROTOCOL.md), flips mirror width."""
    imgs = decode_all(open_entries(cfg_for(image_folder)), 16)
    flip = torch.tensor([False, True])
    x = to_model_input(imgs[:2], flip, 16)
    ref = F.interpolate(imgs[:2].float(), size=(16, 16), mode="bilinear", antialias=True,
                        align_corners=False) / 127.5 - 1
    assert torch.allclose(x[0], ref[0]) and torch.allclose(x[1], ref[1].flip(2))
    assert x.min() >= -1 and x.max() <= 1


def test_every_epoch_is_a_permutation_and_order_is_seeded():
    s = IndexSchedule(10, seed=3)
    idx, _ = s.lookup(0, 30)
    for e in range(3):
        assert sorted(idx[e * 10 : (e + 1) * 10].tolist()) == list(range(10))
    assert not torch.equal(idx[:10], idx[10:20])  # a new permutation each epoch
    assert torch.equal(IndexSchedule(10, seed=3).lookup(7, 9)[0], idx[7:16])  # positions are pure functions
    assert not torch.equal(IndexSchedule(10, seed=4).lookup(0, 10)[0], idx[:10])


def _global_batch(n_images, layout: Layout, step: int, cfg) -> tuple[list, list]:
    idx, flip = [], []
    for micro in range(layout.accum):
        for rank in range(layout.world_size):
            data = TrainData(cfg, layout, rank, torch.device("cpu"),
                             images=torch.zeros(n_images, 3, 2, 2, dtype=torch.uint8))
            i, f = data.indices(step, micro)
            idx += i.tolist()
            flip += f.tolist()
    return idx, flip


@pytest.mark.parametrize("step", [0, 1, 5])
def test_global_batch_is_the_same_for_any_split_over_ranks_and_accumulation(step):
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "train_data_dir": "unused"})
    ref = _global_batch(13, Layout(8, 1, 1), step, cfg)
    assert _global_batch(13, Layout(4, 2, 1), step, cfg) == ref
    assert _global_batch(13, Layout(4, 1, 2), step, cfg) == ref
    assert _global_batch(13, Layout(2, 2, 2), step, cfg) == ref
    # within an epoch the ranks draw different samples
    r0 = TrainData(cfg, Layout(4, 2, 1), 0, torch.device("cpu"), images=torch.zeros(100, 3, 2, 2, dtype=torch.uint8))
    r1 = TrainData(cfg, Layout(4, 2, 1), 1, torch.device("cpu"), images=torch.zeros(100, 3, 2, 2, dtype=torch.uint8))
    assert set(r0.indices(step, 0)[0].tolist()).isdisjoint(r1.indices(step, 0)[0].tolist())


def test_flip_is_off_without_random_flip():
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "train_data_dir": "unused", "random_flip": False})
    d = TrainData(cfg, Layout(64), 0, torch.device("cpu"), images=torch.zeros(100, 3, 2, 2, dtype=torch.uint8))
    assert not d.indices(0, 0)[1].any()
    cfg = replace(cfg, random_flip=True)
    d = TrainData(cfg, Layout(64), 0, torch.device("cpu"), images=torch.zeros(100, 3, 2, 2, dtype=torch.uint8))
    assert 10 < int(d.indices(0, 0)[1].sum()) < 54


def test_streaming_loader_yields_the_same_batches_as_resident_data(image_folder):
    cfg = cfg_for(image_folder, dataloader_num_workers=0)
    entries = open_entries(cfg)
    images = decode_all(entries, 16)
    resident = TrainData(cfg, Layout(4, 1, 2), 0, torch.device("cpu"), images=images)
    streaming = TrainData(cfg, Layout(4, 1, 2), 0, torch.device("cpu"), entries=entries)
    it_r, it_s = resident.batches(3), streaming.batches(3)
    for _ in range(4):  # crosses an epoch boundary (24 images, 8 per step)
        for a, b in zip(next(it_r), next(it_s)):
            assert torch.allclose(a, b, atol=1e-5)


# -- bad input -----------------------------------------------------------------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        open_entries(cfg_for(tmp_path / "nope"))


def test_empty_folder_and_folder_without_images(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no images in folder"):
        open_entries(cfg_for(tmp_path / "empty"))
    (tmp_path / "txt" / "a").mkdir(parents=True)
    (tmp_path / "txt" / "a" / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="no images in folder"):
        open_entries(cfg_for(tmp_path / "txt"))


def test_non_image_zip_and_non_zip_file(tmp_path):
    with zipfile.ZipFile(tmp_path / "docs.zip", "w") as z:
        z.writestr("docs/readme.txt", "not an image")
    with pytest.raises(ConfigError, match="no images in zip"):
        open_entries(cfg_for(tmp_path / "docs.zip"))
    (tmp_path / "file.zip").write_text("not a zip")
    with pytest.raises(ConfigError, match="neither a folder nor a .zip"):
        open_entries(cfg_for(tmp_path / "file.zip"))


def test_corrupt_image_names_the_file(tmp_path):
    write_images(tmp_path / "d", n_per_class=2)
    (tmp_path / "d" / "cat" / "0001.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(ConfigError, match=r"cannot read image 'cat/0001.png'"):
        decode_all(open_entries(cfg_for(tmp_path / "d")), 16)
    z = zip_folder(tmp_path / "d", tmp_path / "d.zip")
    with pytest.raises(ConfigError, match=r"cannot read image 'train/cat/0001.png' in zip"):
        decode_all(open_entries(cfg_for(z)), 16)


def test_cifar10_offline_without_local_copy_says_where_to_put_data(tmp_path, monkeypatch):
    import socket

    def no_network(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "dataset_name": "cifar10", "cache_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="--train_data_dir") as e:
        open_entries(cfg)
    assert "\n" not in str(e.value) and "shared/" not in str(e.value)  # no path of this project's development setup


def test_a_slow_decode_shows_one_progress_bar_line_on_a_terminal(monkeypatch):
    """More than a second of decoding: a labelled progress bar (tqdm on stderr, a terminal only); none without a
    label or when the output is not a terminal."""
    import io
    import time

    class Slow(ImageEntries):
        description = "slow"

        def __len__(self):
            return 6

        def open(self, i):
            time.sleep(0.3)
            return Image.new("RGB", (16, 16), (i, 0, 0))

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, label, shown in ((Terminal(), "data: decoding slow", True), (Terminal(), None, False),
                                 (io.StringIO(), "data: decoding slow", False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert decode_all(Slow(), 16, threads=1, label=label).shape == (6, 3, 16, 16)
        assert ("data: decoding slow:" in stream.getvalue() and "/6 [" in stream.getvalue()) == shown


def test_56_data_is_decoded_once_then_loaded_from_the_cache_keyed_by_its_content(tmp_path):
    """The second decode of the same source at the same resolution loads the cached array (identical images); a
    changed file, another resolution or a damaged cache entry decode again; a cache that cannot be written warns."""
    import os

    from PIL import Image

    from adaptive.data import decode_or_load
    from adaptive.sources import FolderEntries, ZipEntries

    folder = write_images(tmp_path / "imgs", n_per_class=3)
    cache = tmp_path / "cache"
    first, cached = decode_or_load(FolderEntries(folder), 16, cache_dir=cache)
    assert not cached and len(list((cache / "decoded").glob("*.npy"))) == 1
    again, cached = decode_or_load(FolderEntries(folder), 16, cache_dir=cache)
    assert cached and torch.equal(first, again)
    assert not decode_or_load(FolderEntries(folder), 8, cache_dir=cache)[1]  # another resolution: its own entry
    assert not decode_or_load(FolderEntries(folder), 16, limit=4, cache_dir=cache)[1]  # another count too

    victim = sorted(folder.rglob("*.png"))[0]
    Image.new("RGB", (32, 32), (255, 0, 0)).save(victim)
    os.utime(victim, ns=(10**18, 10**18))  # a new content and time: a new key
    changed, cached = decode_or_load(FolderEntries(folder), 16, cache_dir=cache)
    assert not cached and not torch.equal(changed, first)

    for entry in (cache / "decoded").glob("*.npy"):
        entry.write_bytes(b"not an array")
    repaired, cached = decode_or_load(FolderEntries(folder), 16, cache_dir=cache)
    assert not cached and torch.equal(repaired, changed)
    assert decode_or_load(FolderEntries(folder), 16, cache_dir=cache)[1]  # rewritten whole

    import zipfile

    archive = tmp_path / "imgs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(folder.rglob("*.png")):
            z.write(p, p.relative_to(folder).as_posix())
    lines = []
    blocked = tmp_path / "a_file"
    blocked.write_text("x")  # the cache folder would have to be inside a file
    images, cached = decode_or_load(ZipEntries(archive), 16, cache_dir=blocked, log=lines.append)
    assert not cached and torch.equal(images, changed) and "could not be cached" in lines[0]
