#!/usr/bin/env python
"""Score generated images: FID (clean-fid Inception) or proxy FD (a TorchScript feature network), KID and
precision/recall against a reference -> metrics.json and a one-line summary.

    python evaluate_fid.py --samples samples/x                       # FID vs clean-fid's CIFAR-10 train statistics
    python evaluate_fid.py --samples samples/x --feature_extractor cifar10-proxy-features.pt --ref_dir train.zip
    python evaluate_fid.py --make_ref --ref_dir train.zip --feature_extractor cifar10-proxy-features.pt

--samples is a sample.py output_dir (its images/ are read), any folder of images (searched recursively) or an .npz
(arr_0: uint8 [N, H, W, 3]); its first --num_images images (sorted by name) are scored. Images go through clean-fid's
pipeline (the mode's resize, then the network) for both kinds of network. A Frechet distance in any feature space
other than Inception's is written as proxy_fd, never as FID.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from adaptive.config import ConfigError, OneLineParser

CLEAN_FID_REFS = {"cifar10-train": ("cifar10", 32, "train"), "cifar10-test": ("cifar10", 32, "test")}
REF_SEED = 0  # the random subset of --ref_num_images reference images, and the P/R subsets
PR_K = 3  # neighbourhood size of precision/recall (Kynkaanniemi et al. 2019)


def parse_args(argv=None):
    p = OneLineParser(prog="evaluate_fid.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", help="sample.py output_dir, folder of images, or .npz (arr_0 uint8 NHWC)")
    p.add_argument("--num_images", type=int, default=10_000, help="images to score; fewer in --samples is an error")
    p.add_argument("--feature_extractor", default="inception",
                   help="'inception' (clean-fid, FID) or PATH.pt: TorchScript [N,3,H,W] in [0,255] -> [N,D] (proxy FD)")
    p.add_argument("--mode", choices=("clean", "legacy_tensorflow", "legacy_pytorch"), default="clean",
                   help="clean-fid's resize mode (legacy_tensorflow matches published TF-FID numbers)")
    p.add_argument("--ref", choices=sorted(CLEAN_FID_REFS), default=None,
                   help="clean-fid's precomputed Inception statistics (default cifar10-train when no other reference)")
    p.add_argument("--ref_dir", help="reference images: a folder, a .zip or an .npz; statistics cached per content")
    p.add_argument("--ref_dataset", help="reference images from a dataset: 'cifar10' (torchvision) or a Hub id")
    p.add_argument("--ref_num_images", type=int, default=None,
                   help="a fixed random subset (seed 0) of this many reference images; default: all")
    p.add_argument("--ref_stats", help="reference .npz (mu, sigma, optional feats); with --make_ref: where to write it")
    p.add_argument("--make_ref", action="store_true",
                   help="only build (and cache) the statistics of --ref_dir/--ref_dataset, print the path and exit")
    p.add_argument("--output", help="metrics file; default: metrics.json next to the samples")
    p.add_argument("--cache_dir", help="cache root; default ~/.cache/adaptive-diffusion (reference_stats/ inside)")
    p.add_argument("--batch_size", type=int, default=128, help="images per feature-network batch")
    p.add_argument("--num_workers", type=int, default=min(4, os.cpu_count() or 1), help="clean-fid resize workers")
    p.add_argument("--device", default=None, help="feature-network device; default cuda when available, else cpu")
    return p.parse_args(argv)


def check_args(args) -> None:
    """Flag combinations; one-line ConfigError for the first problem."""
    source = args.ref_dir or args.ref_dataset
    if args.ref_dir and args.ref_dataset:
        raise ConfigError("give one of --ref_dir and --ref_dataset")
    if args.make_ref:
        if not source:
            raise ConfigError("--make_ref needs --ref_dir (folder/.zip/.npz) or --ref_dataset")
        return
    if not args.samples:
        raise ConfigError("--samples is required (a sample.py output_dir, a folder of images or an .npz)")
    if sum(bool(x) for x in (args.ref, source, args.ref_stats)) > 1:
        raise ConfigError("give one reference: --ref, --ref_dir/--ref_dataset or --ref_stats")
    if args.feature_extractor != "inception" and not (source or args.ref_stats):
        raise ConfigError(f"--ref {args.ref or 'cifar10-train'} holds Inception statistics; with --feature_extractor "
                          f"{args.feature_extractor} give --ref_dir, --ref_dataset or --ref_stats (see --make_ref)")
    for name in ("num_images", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.ref_num_images is not None and args.ref_num_images < 2:
        raise ConfigError(f"--ref_num_images must be at least 2 (got {args.ref_num_images})")


# ----------------------------------------------------------------------------------------------------------------
# Image sets: validated once, then read by clean-fid (files) or from memory (arrays).


@dataclass
class ImageSet:
    description: str  # for messages and metrics.json
    size: Optional[tuple[int, int]]  # (H, W) of every image; None until checked
    files: Optional[list[str]] = None  # image paths, or member names of `zip_path`
    zip_path: Optional[str] = None
    array: Optional[np.ndarray] = None  # uint8 [N, H, W, 3] when not read from files
    sampling: dict = field(default_factory=dict)  # sample.py's sampling.json, when the images come with one
    entries: object = None  # adaptive.data Folder/ZipEntries of `files`, for a deferred check_sizes

    def __len__(self) -> int:
        return len(self.files) if self.files is not None else len(self.array)


def open_images(path: str, flag: str, num: Optional[int] = None, random_subset: bool = False,
                check: bool = True) -> ImageSet:
    """Folder / zip / npz -> an ImageSet of `num` images (the first ones, or a seeded random subset), validated
    unless check=False (then `size` is None until `check_sizes(images.entries)`)."""
    from adaptive.data import FolderEntries, ZipEntries

    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{flag} {p} does not exist")
    sampling = {}
    if p.is_dir() and (p / "images").is_dir() and (p / "sampling.json").is_file():  # a sample.py output_dir
        sampling, p = read_json(p / "sampling.json"), p / "images"
    if p.suffix == ".npz":
        sampling = read_json(p.parent / "sampling.json") if (p.parent / "sampling.json").is_file() else {}
        array = load_npz_images(p)
        idx = pick(len(array), num, random_subset, f"{flag} {p}")
        return ImageSet(f"{p}", tuple(array.shape[1:3]), array=array[idx], sampling=sampling)
    if p.is_dir():
        entries = FolderEntries(p)
    elif zipfile.is_zipfile(p):
        if ".zip" not in str(p):  # clean-fid recognises a zip by this substring of its path
            raise ConfigError(f"{flag} {p} is a zip file; clean-fid reads zips only from a path containing '.zip'")
        entries = ZipEntries(p)
    else:
        raise ConfigError(f"{flag} {p} is neither a folder, a .zip of images nor an .npz")
    idx = pick(len(entries), num, random_subset, f"{flag} {entries.description}")
    if isinstance(entries, FolderEntries):
        entries.files = [entries.files[i] for i in idx]
        files, zip_path = [str(f) for f in entries.files], None
    else:
        entries.names = [entries.names[i] for i in idx]
        files, zip_path = list(entries.names), str(p)
    size = check_sizes(entries) if check else None
    return ImageSet(entries.description, size, files=files, zip_path=zip_path, sampling=sampling, entries=entries)


def open_dataset(name: str, num: Optional[int], cache_dir: Optional[str]) -> ImageSet:
    """A dataset (torchvision CIFAR-10 or a Hub dataset) decoded into memory."""
    from adaptive.config import TrainConfig
    from adaptive.data import open_entries

    try:
        entries = open_entries(TrainConfig(dataset_name=name, train_data_dir=None, cache_dir=cache_dir))
    except ConfigError as e:  # adaptive.data speaks of the training flags
        raise ConfigError(str(e).replace("--train_data_dir", "--ref_dir")) from None
    idx = pick(len(entries), num, True, f"--ref_dataset {name}")
    array = entries.array[idx] if hasattr(entries, "array") else np.stack([np.asarray(entries.open(i)) for i in idx])
    check_sizes_array(array, entries.description)
    return ImageSet(entries.description, tuple(array.shape[1:3]), array=array)


def pick(count: int, num: Optional[int], random_subset: bool, what: str) -> list[int]:
    """Indices of the images to use: all, the first `num`, or a random subset of `num` (seed REF_SEED), sorted."""
    if count == 0:
        raise ConfigError(f"no images in {what} (expected .png/.jpg/.jpeg/.bmp/... files)")
    if num is None:
        return list(range(count))
    if count < num:
        raise ConfigError(f"{what} holds {count} images, fewer than the {num} requested")
    if not random_subset:
        return list(range(num))
    return sorted(np.random.default_rng(REF_SEED).choice(count, num, replace=False).tolist())


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


def check_sizes(entries) -> tuple[int, int]:
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


def check_sizes_array(array: np.ndarray, description: str) -> None:
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ConfigError(f"{description}: images are {array.dtype} {list(array.shape)}, expected uint8 [N, H, W, 3]")


def fmt_size(hw) -> str:
    return f"{hw[1]}x{hw[0]}"


def content_digest(images: ImageSet) -> str:
    """sha256 of what the images are: file bytes (folder), the zip and member list, or the pixels (arrays)."""
    from adaptive.fid import file_sha256

    h = hashlib.sha256()
    if images.array is not None:
        h.update(np.ascontiguousarray(images.array).tobytes())
    elif images.zip_path is not None:
        h.update(file_sha256(images.zip_path).encode())
        h.update("\n".join(images.files).encode())
    else:
        for f in images.files:
            h.update(Path(f).name.encode())
            h.update(Path(f).read_bytes())
    return h.hexdigest()


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ----------------------------------------------------------------------------------------------------------------
# Features and references.


def load_featnet(args):
    import torch

    from adaptive.fid import FeatureNet

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return FeatureNet(args.feature_extractor, device, args.mode, args.batch_size)


def features(images: ImageSet, featnet, args) -> np.ndarray:
    """[N, D] float64 features through clean-fid's pipeline (files) or the same pipeline on arrays."""
    from adaptive.fid import array_features, files_features

    common = dict(mode=args.mode, device=featnet.device, batch_size=args.batch_size, num_workers=args.num_workers)
    if images.files is not None:
        return files_features(images.files, featnet.as_clean_fid_extractor(), zip_path=images.zip_path, **common)
    return array_features(images.array, featnet.as_clean_fid_extractor(), **common)


def reference_images(args) -> ImageSet:
    """--ref_dataset decoded, or --ref_dir opened but not yet decoded (a cache hit needs only its digest)."""
    if args.ref_dataset:
        return open_dataset(args.ref_dataset, args.ref_num_images, args.cache_dir)
    return open_images(args.ref_dir, "--ref_dir", args.ref_num_images, random_subset=True, check=False)


def build_reference(args, featnet) -> tuple[dict, Path]:
    """Statistics and features of --ref_dir/--ref_dataset, cached under cache_dir/reference_stats/ by content."""
    from adaptive.data import default_cache_dir
    from adaptive.fid import feature_stats, load_stats, save_stats, stats_meta

    images = reference_images(args)
    key = json.dumps([content_digest(images), featnet.identity, args.mode, len(images), REF_SEED])
    name = hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz"
    path = default_cache_dir(args.cache_dir) / "reference_stats" / name
    if not path.exists():
        if images.size is None:
            images.size = check_sizes(images.entries)
        meta = dict(resolution=list(images.size), feature_extractor=featnet.identity, feature_name=featnet.name,
                    mode=args.mode, source=images.description, num_images=len(images))
        feats = features(images, featnet, args)
        save_stats(path, *feature_stats(feats), feats, **meta)
    return {**stats_meta(path), **load_stats(path), "name": images.description}, path


def load_reference(args, featnet, size: tuple[int, int]) -> dict:
    """{'mu', 'sigma', ['feats'], 'name', ...} of the chosen reference, checked against the samples' size."""
    from adaptive.fid import INCEPTION, clean_fid_reference, load_stats, stats_meta

    if args.ref_stats:
        p = Path(args.ref_stats).expanduser()
        if not p.is_file():
            raise ConfigError(f"--ref_stats {p} does not exist")
        ref = {**stats_meta(p), **load_stats(p), "name": str(p)}
        if ref.get("feature_extractor") not in (None, featnet.identity):
            raise ConfigError(f"--ref_stats {p} was built with {ref.get('feature_name', ref['feature_extractor'])}, "
                              f"not {featnet.name}")
        if ref.get("mode") not in (None, args.mode):
            raise ConfigError(f"--ref_stats {p} was built in mode {ref['mode']}, not --mode {args.mode}")
    elif args.ref_dir or args.ref_dataset:
        ref, _ = build_reference(args, featnet)
    else:
        name = args.ref or "cifar10-train"
        assert featnet.spec == INCEPTION  # check_args
        dataset, res, split = CLEAN_FID_REFS[name]
        mu, sigma = clean_fid_reference(dataset, res, args.mode, split)
        ref = {"mu": mu, "sigma": sigma, "resolution": [res, res], "name": f"{name} (clean-fid)"}
    if ref.get("resolution") is not None and tuple(ref["resolution"]) != tuple(size):
        raise ConfigError(f"the reference {ref['name']} is {fmt_size(ref['resolution'])} px but the samples are "
                          f"{fmt_size(size)} px")
    return ref


def make_ref(args) -> int:
    featnet = load_featnet(args)
    ref, path = build_reference(args, featnet)
    if args.ref_stats:
        from adaptive.fid import save_stats

        keys = ("resolution", "feature_extractor", "feature_name", "mode", "source", "num_images")
        path = save_stats(Path(args.ref_stats).expanduser(), ref["mu"], ref["sigma"], ref["feats"],
                          **{k: ref[k] for k in keys})
    print(f"reference statistics of {ref['num_images']} images of {ref['name']} ({featnet.name}, {args.mode}): {path}")
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Scores.


def score(feats: np.ndarray, ref: dict, metric: str) -> dict:
    """FD (FID or proxy FD), KID and precision/recall (k=3) of sample features against the reference."""
    from adaptive.fid import feature_stats, frechet_distance, kernel_inception_distance, precision_recall

    if ref["mu"].shape[0] != feats.shape[1]:
        raise ConfigError(f"the reference {ref['name']} has {ref['mu'].shape[0]}-dimensional features but the "
                          f"feature network gives {feats.shape[1]}")
    mu, sigma = feature_stats(feats)
    try:
        fd = frechet_distance(mu, sigma, ref["mu"], ref["sigma"])
    except ValueError as e:  # clean-fid: a large imaginary part of sqrtm(S1 S2), from degenerate covariances
        raise ConfigError(f"the Frechet distance is numerically undefined ({e}); use more images than the "
                          f"{feats.shape[1]} feature dimensions") from None
    out = {metric: fd, "kid": None, "precision": None, "recall": None}
    ref_feats = ref.get("feats")
    if ref_feats is None:
        reason = f"the reference {ref['name']} has statistics only, no features (build one with --make_ref)"
        out["null_reasons"] = {"kid": reason, "precision": reason, "recall": reason}
        return out
    out["kid"] = kernel_inception_distance(feats, ref_feats)
    n = min(len(feats), len(ref_feats))  # precision/recall on equal-size sets
    rng = np.random.default_rng(REF_SEED)
    real = ref_feats[np.sort(rng.choice(len(ref_feats), n, replace=False))]
    fake = feats[np.sort(rng.choice(len(feats), n, replace=False))]
    out["precision"], out["recall"] = precision_recall(real, fake, k=PR_K)
    return out


def summary(m: dict, metric: str) -> str:
    def f(key, digits):
        return "n/a" if m.get(key) is None else f"{m[key]:.{digits}f}"

    return (f"{metric}={f(metric, 3)} kid={f('kid', 4)} precision={f('precision', 2)} recall={f('recall', 2)} "
            f"({m['num_images']} images, {m['feature_extractor']}, {m['mode']}, ref={m['reference']})")


def default_output(samples: str) -> Path:
    p = Path(samples).expanduser()
    return (p.parent if p.suffix == ".npz" else p) / "metrics.json"


def evaluate(args) -> dict:
    t0 = time.perf_counter()
    samples = open_images(args.samples, "--samples", args.num_images)
    featnet = load_featnet(args)
    ref = load_reference(args, featnet, samples.size)
    metrics = score(features(samples, featnet, args), ref, featnet.metric)
    metrics.update(num_images=len(samples), feature_extractor=featnet.name, feature_extractor_id=featnet.identity,
                   mode=args.mode, reference=ref["name"], reference_num_images=ref.get("num_images"),
                   sampler=samples.sampling.get("sampler"),
                   num_inference_steps=samples.sampling.get("num_inference_steps"),
                   samples=str(Path(args.samples).expanduser()), seconds=round(time.perf_counter() - t0, 1))
    out = Path(args.output).expanduser() if args.output else default_output(args.samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2) + "\n")
    print(summary(metrics, featnet.metric))
    return metrics


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        check_args(args)
        if args.make_ref:
            return make_ref(args)
        evaluate(args)
    except ConfigError as e:
        print(f"evaluate_fid.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
