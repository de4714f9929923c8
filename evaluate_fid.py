#!/usr/bin/env python
"""Score generated images: FID (clean-fid Inception) or proxy FD (a TorchScript feature network), KID and
precision/recall against a reference -> metrics.json and a one-line summary.

    python evaluate_fid.py --samples samples/x                       # FID vs clean-fid's CIFAR-10 train statistics
    python evaluate_fid.py --samples samples/x --feature_extractor cifar10-proxy-features.pt --ref_dir train.zip
    python evaluate_fid.py --make_ref --ref_dir train.zip --feature_extractor cifar10-proxy-features.pt
    python evaluate_fid.py --samples samples/x-2000 --like_run runs/x   # as runs/x's in-training evaluation scored

--samples is a sample.py output_dir (its images/ are read), any folder of images (searched recursively) or an .npz
(arr_0: uint8 [N, H, W, 3]); its first --num_images images (sorted by name) are scored. Features and reference
statistics come from adaptive/fid.py, the same code as the in-training evaluation: Inception gets clean-fid's resize
of the mode, a TorchScript network the images at their own size (its contract). A reference larger than the samples
is resized to their size as the training data pipeline does. A Frechet distance in any feature space other than
Inception's is written as proxy_fd, never as FID. --like_run RUN scores as RUN's in-training evaluation did: its
image count, feature network, mode and reference (the same decision and subset, adaptive/evaluation.py), so that
samples made with `sample.py --like_run RUN` give the logged number exactly (docs/evaluation.md).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from adaptive.config import (ConfigError, OneLineParser, TrainConfig, fill_like_run, like_run_help, load_run_config,
                             replace)
from adaptive.faults import check_output_path, run_cli

CLEAN_FID_REFS = {"cifar10-train": ("cifar10", 32, "train"), "cifar10-test": ("cifar10", 32, "test")}
PR_SEED = 0  # the equal-size precision/recall subsets
PR_K = 3  # neighbourhood size of precision/recall (Kynkaanniemi et al. 2019)
FEATURE_BATCH = 250  # images per feature-network batch: the in-training evaluator's (adaptive.fid.FeatureNet)
# --like_run RUN scores as RUN's in-training evaluation did: the flags not given take these fields of its config (and
# without --ref/--ref_dir/--ref_dataset/--ref_stats, its reference). flag: (default without --like_run, the field)
LIKE_RUN = {
    "num_images": (10_000, "eval_num_images"),
    "feature_extractor": ("inception", "eval_feature_extractor"),
    "mode": ("clean", "eval_mode"),
    "ref_num_images": (None, "eval_ref_num_images"),
}


def parse_args(argv=None):
    p = OneLineParser(prog="evaluate_fid.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", help="sample.py output_dir, folder of images, or .npz (arr_0 uint8 NHWC)")
    p.add_argument("--like_run", default=None,
                   help="a training run (or checkpoint) folder: score as its in-training evaluation did - the flags "
                        "marked --like_run below and, unless one is given, the reference come from the run")
    p.add_argument("--num_images", type=int, default=None,
                   help=like_run_help("images to score; fewer in --samples is an error", "num_images", LIKE_RUN))
    p.add_argument("--feature_extractor", default=None,
                   help=like_run_help("'inception' (clean-fid, FID) or PATH.pt: TorchScript [N,3,H,W] in [0,255] -> "
                                      "[N,D] (proxy FD)", "feature_extractor", LIKE_RUN))
    p.add_argument("--mode", choices=("clean", "legacy_tensorflow", "legacy_pytorch"), default=None,
                   help=like_run_help("clean-fid's resize mode (legacy_tensorflow matches published TF-FID numbers)",
                                      "mode", LIKE_RUN))
    p.add_argument("--ref", choices=sorted(CLEAN_FID_REFS), default=None,
                   help="clean-fid's precomputed Inception statistics [default: cifar10-train when no other "
                        "reference is given]")
    p.add_argument("--ref_dir", help="reference images: a folder, a .zip or an .npz; statistics cached per content")
    p.add_argument("--ref_dataset", help="reference images from a dataset: 'cifar10' (torchvision) or a Hub id")
    p.add_argument("--ref_num_images", type=int, default=None,
                   help="a fixed random subset (seed 0) of this many reference images [default: all; --like_run: the "
                        "run's eval_ref_num_images]")
    p.add_argument("--ref_stats", help="reference .npz (mu, sigma, optional feats); with --make_ref: where to write it")
    p.add_argument("--make_ref", action="store_true",
                   help="only build (and cache) the statistics of --ref_dir/--ref_dataset, print the path and exit")
    p.add_argument("--resolution", type=int, default=None,
                   help="with --make_ref: build the statistics at this size [default: the images' own size]")
    p.add_argument("--output", help="metrics file [default: metrics.json next to the samples]")
    p.add_argument("--cache_dir", help="cache root, reference_stats/ inside [default: ~/.cache/adaptive-diffusion]")
    p.add_argument("--batch_size", type=int, default=FEATURE_BATCH, help="images per feature-network batch")
    p.add_argument("--device", default=None, help="feature-network device [default: cuda when available, else cpu]")
    return p.parse_args(argv)


def resolve_args(args):
    """The flags not given from --like_run's config (`run`: the config, None without --like_run), else defaults."""
    run = load_run_config(args.like_run) if args.like_run else None
    return fill_like_run(args, LIKE_RUN, run), run


def given_reference(args) -> bool:
    return bool(args.ref or args.ref_dir or args.ref_dataset or args.ref_stats)


def check_args(args) -> None:
    """Flag combinations; one-line ConfigError for the first problem."""
    source = args.ref_dir or args.ref_dataset
    if args.ref_dir and args.ref_dataset:
        raise ConfigError("give one of --ref_dir and --ref_dataset")
    if args.make_ref:
        if not source:
            raise ConfigError("--make_ref needs --ref_dir (folder/.zip/.npz) or --ref_dataset")
        if args.like_run:
            raise ConfigError("--make_ref builds the reference of --ref_dir/--ref_dataset; --like_run scores samples")
        return
    if not args.samples:
        raise ConfigError("--samples is required (a sample.py output_dir, a folder of images or an .npz)")
    if sum(bool(x) for x in (args.ref, source, args.ref_stats)) > 1:
        raise ConfigError("give one reference: --ref, --ref_dir/--ref_dataset or --ref_stats")
    if args.feature_extractor != "inception" and not (source or args.ref_stats or (args.like_run and not args.ref)):
        raise ConfigError(f"--ref {args.ref or 'cifar10-train'} holds Inception statistics; with --feature_extractor "
                          f"{args.feature_extractor} give --ref_dir, --ref_dataset or --ref_stats (see --make_ref)")
    for name in ("num_images", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.ref_num_images is not None and args.ref_num_images < 2:
        raise ConfigError(f"--ref_num_images must be at least 2 (got {args.ref_num_images})")
    check_output_path(Path(args.output).expanduser() if args.output else default_output(args.samples), "--output",
                      folder=False)


# ----------------------------------------------------------------------------------------------------------------
# Features and references (adaptive/fid.py: the same pipeline and cache as the in-training evaluator).


def load_featnet(args):
    import torch

    from adaptive.fid import FeatureNet  # imports torch: keeps --help fast

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return FeatureNet(args.feature_extractor, device, args.mode, args.batch_size)


def features(images, featnet, desc: str = "evaluate_fid.py: features of the samples"):
    """[N, D] float64 features of an ImageSet, read in chunks, with progress (adaptive/progress.py)."""
    from adaptive.progress import progress  # keeps --help fast

    out = []
    with progress(len(images), desc, "img") as bar:
        for chunk in images.chunks():
            out.append(featnet(chunk))
            bar.update(len(chunk))
    return np.concatenate(out)


def reference_source(args):
    """(ImageEntries, description) of --ref_dir (folder, .zip or .npz) or --ref_dataset."""
    from adaptive.data import open_entries  # imports torch: keeps --help fast
    from adaptive.sources import ArrayEntries  # imports numpy and the config: keeps --help fast
    from adaptive.image_files import load_npz_images, path_entries  # imports torch: keeps --help fast

    if args.ref_dataset:
        try:
            entries = open_entries(TrainConfig(dataset_name=args.ref_dataset, train_data_dir=None,
                                               cache_dir=args.cache_dir), dataset_flag="--ref_dataset")
        except ConfigError as e:  # adaptive.data speaks of the training flags
            raise ConfigError(str(e).replace("--train_data_dir", "--ref_dir")) from None
        return entries, entries.description
    p = Path(args.ref_dir).expanduser()
    if not p.exists():
        raise ConfigError(f"--ref_dir {p} does not exist")
    entries = ArrayEntries(load_npz_images(p), str(p)) if p.suffix == ".npz" else path_entries(p, "--ref_dir")
    if len(entries) == 0:
        raise ConfigError(f"no images in --ref_dir {entries.description} (expected .png/.jpg/.jpeg/.bmp/... files)")
    return entries, entries.description


def build_reference(args, featnet, resolution: Optional[int], log=print) -> dict:
    """Statistics of --ref_dir/--ref_dataset at `resolution` (None: the images' own size): a fixed random subset of
    --ref_num_images (seed 0), decoded and resized as the training data pipeline does, cached by content."""
    from adaptive.data import decode_all  # imports torch: keeps --help fast
    from adaptive.sources import default_cache_dir  # imports numpy: keeps --help fast
    from adaptive.fid import reference_stats, reference_subset  # imports torch: keeps --help fast
    from adaptive.image_files import fmt_size  # imports torch: keeps --help fast

    entries, source = reference_source(args)
    w, h = entries.open(0).size
    resolution = resolution or h
    if min(h, w) < resolution:
        raise ConfigError(f"the reference {source} is {w}x{h} px but the samples are {resolution}x{resolution} px; "
                          "a reference is only resized down")
    images = decode_all(entries, resolution, label=f"evaluate_fid.py: decoding the reference {source}",
                        cache_dir=default_cache_dir(args.cache_dir), log=log)
    ref = reference_subset(images, args.ref_num_images, resolution)
    stats = reference_stats(ref, featnet, default_cache_dir(args.cache_dir), source, log)
    if (h, w) != (resolution, resolution):
        stats["resized_from"] = [h, w]
        log(f"evaluate_fid.py: the reference images ({fmt_size((h, w))} px) are resized to the samples' "
            f"{fmt_size((resolution, resolution))} px (bilinear + antialias on [0, 255], the training data pipeline)")
    return stats


def run_reference(args, run, featnet, size: tuple[int, int]) -> dict:
    """The reference of --like_run's in-training evaluation (adaptive.evaluation.training_reference: the same
    decision, images and subset), with --mode and --ref_num_images as resolved."""
    from adaptive.evaluation import training_reference  # imports torch: keeps --help fast
    from adaptive.image_files import fmt_size  # imports torch: keeps --help fast

    if tuple(size) != (run.resolution, run.resolution):
        raise ConfigError(f"the samples are {fmt_size(size)} px but --like_run {args.like_run} trained at "
                          f"{run.resolution}x{run.resolution} px")
    cfg = replace(run, eval_mode=args.mode, eval_ref_num_images=args.ref_num_images,
                  cache_dir=args.cache_dir or run.cache_dir)
    return training_reference(cfg, featnet, None, print)


def load_reference(args, featnet, size: tuple[int, int], run=None) -> dict:
    """{'mu', 'sigma', ['feats'], 'name', ...} of the chosen reference at the samples' size (`run`: --like_run's
    config, whose reference is used when no other is given)."""
    from adaptive.fid import INCEPTION, clean_fid_reference, load_reference_stats  # imports torch: keeps --help fast
    from adaptive.image_files import fmt_size  # imports torch: keeps --help fast

    if run is not None and not given_reference(args):
        return run_reference(args, run, featnet, size)
    if args.ref_stats:
        return load_reference_stats(args.ref_stats, featnet, size)
    if args.ref_dir or args.ref_dataset:
        if size[0] != size[1]:
            raise ConfigError(f"the samples are {fmt_size(size)} px; a reference is built for square images only")
        return build_reference(args, featnet, size[0])
    name = args.ref or "cifar10-train"
    assert featnet.spec == INCEPTION  # check_args
    dataset, res, split = CLEAN_FID_REFS[name]
    if tuple(size) != (res, res):
        raise ConfigError(f"the reference {name} (clean-fid) is {res}x{res} px but the samples are {fmt_size(size)} "
                          "px; give --ref_dir with the real images (resized to the samples' size)")
    mu, sigma = clean_fid_reference(dataset, res, args.mode, split)
    return {"mu": mu, "sigma": sigma, "resolution": [res, res], "name": f"{name} (clean-fid)"}


def make_ref(args) -> int:
    from adaptive.fid import save_stats  # imports torch: keeps --help fast

    ref = build_reference(args, load_featnet(args), args.resolution)
    path = ref["path"]
    if args.ref_stats:
        keys = ("resolution", "feature_extractor", "feature_name", "mode", "source", "num_images", "content")
        path = save_stats(Path(args.ref_stats).expanduser(), ref["mu"], ref["sigma"], ref["feats"],
                          **{k: ref[k] for k in keys})
    print(f"reference statistics of {ref['num_images']} images of {ref['name']} at {ref['resolution'][1]}x"
          f"{ref['resolution'][0]} px ({ref['feature_name']}, {args.mode}): {path}")
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Scores.


def score(feats: np.ndarray, ref: dict, metric: str) -> dict:
    """FD (FID or proxy FD), KID and precision/recall (k=3) of sample features against the reference."""
    from adaptive.fid import (  # imports torch: keeps --help fast
        feature_stats, frechet_distance, kernel_inception_distance, precision_recall)

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
    if n <= PR_K:  # the k-th nearest neighbour other than the point itself needs k + 1 points
        out["null_reasons"] = {k: f"{n} images: precision/recall (k={PR_K}) need at least {PR_K + 1}"
                               for k in ("precision", "recall")}
        return out
    rng = np.random.default_rng(PR_SEED)
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


def warn_unlike_run(samples, run, log) -> None:
    """--like_run: say when sample.py's record shows the samples were not made as the run's evaluation made its own."""
    expected = {"scheduler": "ddpm", "seed_offset": run.eval_seed_offset,
                "num_inference_steps": run.eval_inference_steps, "mixed_precision": run.mixed_precision}
    made = samples.sampling
    diff = [f"{k} {made[k]} (the run's: {v})" for k, v in expected.items() if k in made and made[k] != v]
    if diff:
        log(f"warning: --samples were not made as --like_run's evaluation sampled ({', '.join(diff)}), so the score "
            "is not comparable with the logged one; make them with sample.py --like_run")


def evaluate(args, run=None) -> dict:
    """Score --samples (`run`: --like_run's config or None) -> metrics.json and the summary line."""
    from adaptive.fid import warn_if_few  # imports torch: keeps --help fast
    from adaptive.image_files import open_images  # imports torch: keeps --help fast

    t0 = time.perf_counter()
    samples = open_images(args.samples, "--samples", args.num_images)
    if run is not None:
        warn_unlike_run(samples, run, lambda m: print(m, file=sys.stderr))
    featnet = load_featnet(args)
    ref = load_reference(args, featnet, samples.size, run)
    feats = features(samples, featnet)
    warn_if_few(len(feats), feats.shape[1], "--samples", lambda m: print(m, file=sys.stderr))
    metrics = score(feats, ref, featnet.metric)
    metrics.update(num_images=len(samples), feature_extractor=featnet.name, feature_extractor_id=featnet.identity,
                   mode=args.mode, reference=ref["name"], reference_num_images=ref.get("num_images"),
                   reference_resized_from=ref.get("resized_from"),
                   sampler=samples.sampling.get("sampler"),
                   num_inference_steps=samples.sampling.get("num_inference_steps"),
                   samples=str(Path(args.samples).expanduser()), like_run=args.like_run,
                   seconds=round(time.perf_counter() - t0, 1))
    out = Path(args.output).expanduser() if args.output else default_output(args.samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2) + "\n")
    print(summary(metrics, featnet.metric))
    return metrics


def main(argv=None) -> int:
    return run_cli("evaluate_fid.py", lambda: _evaluate_or_make_ref(parse_args(argv)))


def _evaluate_or_make_ref(args) -> int:
    args, run = resolve_args(args)
    check_args(args)
    if args.make_ref:
        return make_ref(args)
    evaluate(args, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
