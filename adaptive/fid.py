"""Feature extraction, reference statistics and the scores (wrapping clean-fid): the one implementation behind the
in-training evaluator (adaptive/evaluation.py) and evaluate_fid.py, so both give the same number for the same images.

Two kinds of feature network (`FeatureNet`, uint8 [N, H, W, 3] -> features [N, D]):
- 'inception' (clean-fid's Inception-v3, FID proper): needs clean-fid's weights file (downloaded at first use, or
  pre-placed at /tmp/inception-2015-12-05.pt offline); images go through clean-fid's resizer of the chosen mode.
- a TorchScript file (e.g. shared/eval/cifar10-proxy-features.pt): gets the images as its contract says, NCHW floats
  in [0, 255] at their own size. Its Frechet distance is a proxy, always labelled "proxy FD", never FID.
Reference statistics are built from uint8 images at the evaluated resolution (a fixed random subset, seed 0, of the
source, through the training data pipeline) and cached by the images' content digest + the network's identity
(which includes the mode for Inception) + the resolution.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .config import ConfigError
from .progress import progress

INCEPTION = "inception"
INCEPTION_FILE = "/tmp/inception-2015-12-05.pt"  # where clean-fid looks for (and downloads) its Inception weights


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^1/2) (Heusel et al. 2017, eq. 6), via clean-fid."""
    from cleanfid.fid import frechet_distance as _fd

    return float(_fd(np.asarray(mu1, np.float64), np.asarray(sigma1, np.float64),
                     np.asarray(mu2, np.float64), np.asarray(sigma2, np.float64)))


def feature_stats(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean [D] and covariance [D, D] (unbiased, float64) of features [N, D]."""
    f = np.asarray(feats, np.float64)
    return f.mean(0), np.cov(f, rowvar=False)


def kernel_inception_distance(feats1: np.ndarray, feats2: np.ndarray, num_subsets: int = 100,
                              max_subset_size: int = 1000, seed: int = 0) -> float:
    """Unbiased MMD^2 with the cubic polynomial kernel over random subsets (Binkowski et al. 2018): clean-fid's
    kernel_distance, its subsets drawn from numpy's global RNG seeded here (and restored after)."""
    from cleanfid.fid import kernel_distance

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return float(kernel_distance(np.asarray(feats1, np.float64), np.asarray(feats2, np.float64),
                                     num_subsets=num_subsets, max_subset_size=max_subset_size))
    finally:
        np.random.set_state(state)


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = 3, batch: int = 2048) -> tuple[float, float]:
    """Improved precision and recall with k-NN manifolds (Kynkaanniemi et al. 2019, Sec. 3, k = 3)."""
    real_t = torch.from_numpy(np.asarray(real, np.float32))
    fake_t = torch.from_numpy(np.asarray(fake, np.float32))

    def radii(x):
        r = []
        for i in range(0, len(x), batch):
            d = torch.cdist(x[i : i + batch], x)
            r.append(d.kthvalue(k + 1, dim=1).values)  # +1: the point itself is at distance 0
        return torch.cat(r)

    def coverage(points, manifold, manifold_radii):
        inside = []
        for i in range(0, len(points), batch):
            d = torch.cdist(points[i : i + batch], manifold)
            inside.append((d <= manifold_radii[None]).any(1))
        return torch.cat(inside).float().mean().item()

    return coverage(fake_t, real_t, radii(real_t)), coverage(real_t, fake_t, radii(fake_t))


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class FeatureNet:
    """A feature network with one call: uint8 images [N, H, W, 3] -> float64 features [N, D] (numpy)."""

    def __init__(self, spec: str, device: torch.device | str = "cpu", mode: str = "clean", batch_size: int = 250,
                 flag: str = "--feature_extractor"):
        self.spec, self.device, self.mode, self.batch_size = spec, torch.device(device), mode, batch_size
        check_feature_network(spec, flag)
        if spec == INCEPTION:
            self.name, self.metric = f"inception-v3 (clean-fid, {mode})", "fid"
            self._model = _load_inception(mode, self.device)
            from cleanfid.resize import build_resizer

            self._resize = build_resizer(mode)
            self.identity = f"inception:{mode}"
        else:
            path = Path(spec)
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
                    self._model = torch.jit.load(str(path), map_location=self.device).eval()
            except Exception as e:
                raise ConfigError(f"{flag} {spec} is not a TorchScript feature network ({type(e).__name__})") from None
            self._resize = None
            self.name, self.metric = path.name, "proxy_fd"
            self.identity = f"torchscript:{file_sha256(path)}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor | np.ndarray, desc: Optional[str] = None) -> np.ndarray:
        """`desc`: show progress under that name (adaptive/progress.py)."""
        imgs = torch.as_tensor(np.asarray(images)) if not isinstance(images, torch.Tensor) else images
        out = []
        bar = progress(len(imgs), desc or "", "img", enabled=desc is not None)
        for i in range(0, len(imgs), self.batch_size):
            chunk = imgs[i : i + self.batch_size]
            if self._resize is not None:  # clean-fid: resize every uint8 HWC image, then NCHW float [0, 255]
                x = torch.from_numpy(np.stack([self._resize(im) for im in chunk.numpy()])).permute(0, 3, 1, 2)
            else:
                x = chunk.permute(0, 3, 1, 2).float()
            out.append(self._checked(self._model(x.to(self.device)), len(chunk)).float().cpu().numpy())
            bar.update(len(chunk))
        bar.close()
        if not out:
            raise ConfigError("no images to compute features of")
        return np.concatenate(out).astype(np.float64)


    def _checked(self, feats, n: int) -> torch.Tensor:
        """The network's output if it is [n, D] features, else a one-line ConfigError naming the network."""
        if not isinstance(feats, torch.Tensor) or feats.ndim != 2 or feats.shape[0] != n:
            got = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
            raise ConfigError(f"feature extractor {self.spec} returned {got} for {n} images; a feature network must "
                              "return one feature vector per image, [N, D]")
        return feats


def check_feature_network(spec: str, flag: str = "--feature_extractor") -> None:
    """ConfigError (one line, naming `flag`) unless the feature network can be had: a TorchScript file that exists,
    or clean-fid's Inception weights on disk or downloadable. Cheap (nothing loaded): run before any data is
    decoded."""
    if spec != INCEPTION:
        if not Path(spec).expanduser().is_file():
            raise ConfigError(f"{flag} {spec}: the feature network does not exist (a TorchScript .pt file, or "
                              f"'{INCEPTION}' for clean-fid's Inception)")
        return
    if not os.path.exists(INCEPTION_FILE):
        try:
            import socket

            socket.create_connection(("nvlabs-fi-cdn.nvidia.com", 443), timeout=5).close()
        except OSError:
            raise ConfigError(
                f"clean-fid's Inception weights are not at {INCEPTION_FILE} and cannot be downloaded (offline); copy "
                f"inception-2015-12-05.pt there, or pass {flag} PATH.pt (a TorchScript network)"
            ) from None


def _load_inception(mode: str, device: torch.device):
    from cleanfid.features import build_feature_extractor

    return build_feature_extractor(mode, device, use_dataparallel=False)


def clean_fid_reference(dataset: str, resolution: int, mode: str,
                        split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """clean-fid's precomputed Inception statistics (e.g. cifar10 32 px train), or a ConfigError offline."""
    from cleanfid.features import get_reference_statistics

    try:
        return get_reference_statistics(dataset, resolution, mode=mode, split=split)
    except Exception as e:
        import cleanfid

        folder = Path(cleanfid.__file__).parent / "stats"
        raise ConfigError(
            f"clean-fid reference statistics {dataset}_{mode}_{split}_{resolution}.npz are not available "
            f"({type(e).__name__}); offline, put the file in {folder}, or pass --ref_stats FILE.npz / --ref_dir"
        ) from None


def save_stats(path: Path, mu: np.ndarray, sigma: np.ndarray, feats: Optional[np.ndarray] = None, **meta) -> Path:
    """Write the .npz atomically through a temporary file of this writer's own: runs that share the cache (parallel
    benchmark runs, parallel tests) may build the same reference at once, and the last complete file wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp.npz")  # created as a plain write: the umask's mode
    arrays = {"mu": mu, "sigma": sigma}
    if feats is not None:
        arrays["feats"] = feats.astype(np.float32)
    try:
        np.savez(tmp, **arrays, meta=np.array(repr(sorted(meta.items()))))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_stats(path: str | Path) -> dict:
    """mu, sigma (and feats, when stored) from an .npz; no pickled objects are loaded."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read reference statistics {path} ({e})") from None
    if "mu" not in out or "sigma" not in out:
        raise ConfigError(f"{path} has no 'mu' and 'sigma' arrays")
    return out


def stats_meta(path: str | Path) -> dict:
    """The metadata `save_stats` stored next to mu and sigma (resolution, feature extractor, mode, ...); {} if none."""
    import ast

    try:
        with np.load(path, allow_pickle=False) as z:
            return dict(ast.literal_eval(str(z["meta"]))) if "meta" in z.files else {}
    except (OSError, ValueError, KeyError, SyntaxError, TypeError):
        return {}


# ----------------------------------------------------------------------------------------------------------------
# Reference statistics: one pipeline, one cache.

REFERENCE_SEED = 0  # the reference subset is the same for every training seed, method and script


def to_resolution_uint8(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> uint8 [N, S, S, 3]: bilinear + antialias on [0, 255] floats, rounded (the training data
    pipeline, PROTOCOL.md)."""
    y = x.float()
    if y.shape[-1] != resolution or y.shape[-2] != resolution:
        y = torch.nn.functional.interpolate(y, size=(resolution, resolution), mode="bilinear", antialias=True,
                                            align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def reference_subset(images: torch.Tensor, num: Optional[int], resolution: int,
                     seed: int = REFERENCE_SEED) -> torch.Tensor:
    """A fixed random subset of `num` (None: all) of the decoded images uint8 [N, 3, H, W], at the resolution:
    uint8 [num, S, S, 3]."""
    num = len(images) if num is None else num
    if num > len(images):
        raise ConfigError(f"the reference needs {num} images but the source has {len(images)}")
    idx = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:num]
    return torch.cat([to_resolution_uint8(images[idx[i : i + 1000]].cpu(), resolution) for i in range(0, num, 1000)])


def warn_if_few(num_images: int, dim: int, what: str, log: Callable[[str], None]) -> None:
    if num_images < dim:
        log(f"warning: {what} has {num_images} images, fewer than the {dim} feature dimensions: its covariance is "
            "singular and the Frechet distance unreliable")


def reference_stats(ref: torch.Tensor, featnet: "FeatureNet", cache_dir: Path, source: str,
                    log: Callable[[str], None] = print, show: bool = True) -> dict:
    """{'mu', 'sigma', 'feats', metadata} of reference images uint8 [N, S, S, 3], built once and cached under
    cache_dir/reference_stats/ by (content digest, network identity, resolution)."""
    ref = torch.as_tensor(ref)
    digest = hashlib.sha256(ref.contiguous().numpy().tobytes()).hexdigest()
    resolution = list(ref.shape[1:3])
    key = json.dumps([digest, featnet.identity, resolution])
    path = Path(cache_dir) / "reference_stats" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz")
    if not path.exists():
        t0 = time.perf_counter()
        feats = featnet(ref, desc="reference statistics: features" if show else None)
        warn_if_few(len(ref), feats.shape[1], f"the reference {source}", log)
        save_stats(path, *feature_stats(feats), feats, resolution=resolution, feature_extractor=featnet.identity,
                   feature_name=featnet.name, mode=featnet.mode, source=source, num_images=len(ref), content=digest)
        log(f"eval: reference statistics of {len(ref)} images built in {time.perf_counter() - t0:.1f}s -> {path}")
    return {**stats_meta(path), **load_stats(path), "name": source, "path": str(path)}


def load_reference_stats(path: str | Path, featnet: "FeatureNet", resolution: tuple[int, int]) -> dict:
    """A saved reference (.npz with mu, sigma[, feats] and metadata), refused in one line when its metadata says it
    was built with another network, mode or resolution."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"reference statistics {p} do not exist")
    ref = {**stats_meta(p), **load_stats(p), "name": str(p)}
    if ref.get("feature_extractor") not in (None, featnet.identity):
        raise ConfigError(f"reference statistics {p} were built with "
                          f"{ref.get('feature_name', ref['feature_extractor'])}"
                          f" ({ref['feature_extractor']}), not {featnet.name} ({featnet.identity})")
    if ref.get("resolution") is not None and tuple(ref["resolution"]) != tuple(resolution):
        raise ConfigError(f"reference statistics {p} are of {ref['resolution'][1]}x{ref['resolution'][0]} px images "
                          f"but the evaluated images are {resolution[1]}x{resolution[0]} px")
    return ref
