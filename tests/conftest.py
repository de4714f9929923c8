"""Shared fixtures: tiny generated image sets (never ../shared) and a helper that runs the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from adaptive.build import cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = str(Path(sys.executable).parent / "accelerate")


# The toy training runs use the preset's bf16 autocast where the CPU computes bf16 natively (AVX512-BF16 / AMX), and
# fp32 where it would be emulated: there bf16 is 10.6x slower for this model
# (docs/benchmarks/throughput/2026-12-01-avx2: 10.5 vs 111.3 img/s on an AVX2-only AMD EPYC).
PRECISION_FLAGS: tuple[str, ...] = () if cpu_has_native_bf16() else ("--mixed_precision", "no")


def write_images(folder: Path, n_per_class: int = 12, classes=("cat", "dog"), size: int = 32, seed: int = 0) -> Path:
    """Class folders of random-but-structured PNG images (smooth colour fields, so they compress and decode fast)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            base = rng.integers(0, 256, (1, 1, 3))
            grad = np.linspace(0, 1, size)[None, :, None] * rng.integers(-80, 80, (1, 1, 3))
            img = np.clip(base + grad + rng.normal(0, 10, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(folder / c / f"{i:04d}.png")
    return folder


def zip_folder(folder: Path, zip_path: Path, prefix: str = "train") -> Path:
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, f"{prefix}/{p.relative_to(folder).as_posix()}")
    return zip_path


def write_pooled_features(path: Path) -> Path:
    """A TorchScript proxy feature network at toy size: [N, 3, H, W] in [0, 255] -> [N, 48] (4x4 average pools)."""
    import warnings

    import torch

    class PooledFeatures(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.adaptive_avg_pool2d(x / 255.0, 4).flatten(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
        torch.jit.script(PooledFeatures()).save(str(path))
    return path


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("imgs") / "train")


@pytest.fixture(scope="session")
def image_zip(tmp_path_factory, image_folder) -> Path:
    return zip_folder(image_folder, tmp_path_factory.mktemp("zips") / "train.zip")


@pytest.fixture
def fresh_accelerate_state():
    """Training in this process: accelerate's process-wide state must not carry another test's precision."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def tiny_args(data: Path, out: Path, *extra: str, preset_precision: bool = False) -> list[str]:
    """A few-second cpu-tiny16 run on generated data, at PRECISION_FLAGS unless preset_precision (a test's own
    --mixed_precision wins either way)."""
    return ["--preset", "cpu-tiny16", "--train_data_dir", str(data), "--output_dir", str(out), "--logger", "none",
            "--num_grid_images", "4", "--ddpm_num_inference_steps", "4", "--train_batch_size", "4",
            *(() if preset_precision else PRECISION_FLAGS), *extra]


def run_cli(script: str, args: list[str], nproc: int = 1, timeout: float = 600, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run an entry point as users do: python script.py (1 process) or accelerate launch (2 gloo ranks); a `script`
    that is a module name (tests.helpers.x) runs with -m in the repository root (this tree's code, no path edits)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    target = [script] if script.endswith(".py") else ["-m", script]
    if nproc == 1:
        cmd = [sys.executable, *target, *args]
    else:
        full_env["ACCELERATE_USE_CPU"] = "1"
        cmd = [ACCELERATE, "launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
               "--num_processes", str(nproc), *target, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}"
                             f"\nstderr:\n{proc.stderr[-4000:]}")
    return proc
