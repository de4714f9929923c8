"""Feature extraction and Frechet distance (wrapping clean-fid), KID and precision/recall.

Two kinds of feature network:
- 'inception' (clean-fid's Inception-v3, FID proper): needs clean-fid's weights file (downloaded at first use, or
  pre-placed at /tmp/inception-2015-12-05.pt offline); images go through clean-fid's resizer of the chosen mode.
- a TorchScript file (e.g. shared/eval/cifar10-proxy-features.pt): [N, 3, H, W] floats in [0, 255] -> [N, D];
  images are fed at their own size. Its Frechet distance is a proxy, always labelled "proxy FD", never FID.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .config import ConfigError

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
    """Unbiased MMD^2 with the cubic polynomial kernel over random subsets (Binkowski et al. 2018), as clean-fid."""
    rng = np.random.default_rng(seed)
    f1, f2 = np.asarray(feats1, np.float64), np.asarray(feats2, np.float64)
    n = f1.shape[1]
    m = min(min(len(f1), len(f2)), max_subset_size)
    t = 0.0
    for _ in range(num_subsets):
        x = f2[rng.choice(len(f2), m, replace=False)]
        y = f1[rng.choice(len(f1), m, replace=False)]
        a = (x @ x.T / n + 1) ** 3 + (y @ y.T / n + 1) ** 3
        b = (x @ y.T / n + 1) ** 3
        t += (a.sum() - np.diag(a).sum()) / (m - 1) - b.sum() * 2 / m
    return float(t / num_subsets / m)


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

    def __init__(self, spec: str, device: torch.device | str = "cpu", mode: str = "clean", batch_size: int = 250):
        self.spec, self.device, self.mode, self.batch_size = spec, torch.device(device), mode, batch_size
        if spec == INCEPTION:
            self.name, self.metric = f"inception-v3 (clean-fid, {mode})", "fid"
            self._model = _load_inception(mode, self.device)
            from cleanfid.resize import build_resizer

            self._resize = build_resizer(mode)
            self.identity = f"inception:{mode}"
        else:
            path = Path(spec)
            if not path.is_file():
                raise ConfigError(f"feature extractor {spec} does not exist")
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
                    self._model = torch.jit.load(str(path), map_location=self.device).eval()
            except Exception as e:
                raise ConfigError(f"{spec} is not a TorchScript feature network ({type(e).__name__})") from None
            self._resize = None
            self.name, self.metric = path.name, "proxy_fd"
            self.identity = f"torchscript:{file_sha256(path)}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        imgs = torch.as_tensor(np.asarray(images)) if not isinstance(images, torch.Tensor) else images
        out = []
        for i in range(0, len(imgs), self.batch_size):
            chunk = imgs[i : i + self.batch_size]
            if self._resize is not None:  # clean-fid: resize every uint8 HWC image, then NCHW float [0, 255]
                x = torch.from_numpy(np.stack([self._resize(im) for im in chunk.numpy()])).permute(0, 3, 1, 2)
            else:
                x = chunk.permute(0, 3, 1, 2).float()
            out.append(self._model(x.to(self.device)).float().cpu().numpy())
        if not out:
            raise ConfigError("no images to compute features of")
        return np.concatenate(out).astype(np.float64)

    def as_clean_fid_extractor(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """clean-fid's custom_feat_extractor contract: float [N, 3, H, W] in [0, 255] -> features."""
        model = self._model
        return lambda x: model(x.to(self.device)).float()


def _load_inception(mode: str, device: torch.device):
    from cleanfid.features import build_feature_extractor

    if not os.path.exists(INCEPTION_FILE):
        try:
            import socket

            socket.create_connection(("nvlabs-fi-cdn.nvidia.com", 443), timeout=5).close()
        except OSError:
            raise ConfigError(
                f"clean-fid's Inception weights are not at {INCEPTION_FILE} and cannot be downloaded (offline); copy "
                "inception-2015-12-05.pt there, or pass --feature_extractor PATH.pt (a TorchScript network)"
            ) from None
    return build_feature_extractor(mode, device, use_dataparallel=False)


def clean_fid_reference(dataset: str, resolution: int, mode: str, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    arrays = {"mu": mu, "sigma": sigma}
    if feats is not None:
        arrays["feats"] = feats.astype(np.float32)
    np.savez(tmp, **arrays, meta=np.array(repr(sorted(meta.items()))))
    os.replace(tmp, path)
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
# clean-fid's image pipeline (the mode's resize, then the network) over image files or in-memory arrays.


def files_features(files: list[str], extractor: Callable[[torch.Tensor], torch.Tensor], mode: str = "clean",
                   device: torch.device | str = "cpu", batch_size: int = 128, num_workers: int = 0,
                   zip_path: Optional[str | Path] = None) -> np.ndarray:
    """Features [N, D] (float64) of image files, or of members of `zip_path`, via clean-fid's get_files_features."""
    from cleanfid.fid import get_files_features

    feats = get_files_features(list(files), extractor, num_workers=num_workers, batch_size=batch_size,
                               device=torch.device(device), mode=mode, fdir=str(zip_path) if zip_path else None,
                               verbose=False)
    return feats.astype(np.float64)


def array_features(images: np.ndarray, extractor: Callable[[torch.Tensor], torch.Tensor], mode: str = "clean",
                   device: torch.device | str = "cpu", batch_size: int = 128, num_workers: int = 0) -> np.ndarray:
    """Features [N, D] (float64) of uint8 images [N, H, W, 3], with the same per-image pipeline as files_features."""
    from cleanfid.fid import get_batch_features

    loader = torch.utils.data.DataLoader(_ArrayResizeDataset(np.asarray(images), mode), batch_size=batch_size,
                                         shuffle=False, drop_last=False, num_workers=num_workers)
    return np.concatenate([get_batch_features(b, extractor, torch.device(device)) for b in loader]).astype(np.float64)


class _ArrayResizeDataset(torch.utils.data.Dataset):
    """clean-fid's ResizeDataset (cleanfid/utils.py) reading uint8 [N, H, W, 3] from memory instead of files."""

    def __init__(self, images: np.ndarray, mode: str):
        import torchvision
        from cleanfid.resize import build_resizer

        self.images, self.fn_resize = images, build_resizer(mode)
        self.to_tensor = torchvision.transforms.ToTensor()

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.fn_resize(self.images[i])
        # as ResizeDataset: ToTensor scales uint8 to [0, 1] (undone by * 255) and leaves float32 as it is
        return self.to_tensor(np.array(img)) * 255 if img.dtype == np.uint8 else self.to_tensor(img)
