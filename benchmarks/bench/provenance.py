"""Where a number came from: the commit, the hash of the code every method shares, the machine and the versions."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHOD_CONFIG_LINES = ("adaptive_", "speed_", "uncertainty_lr", '"adaptive_')  # config.py lines of one method only


def git(*args: str) -> str:
    """`git ARGS` in the repository, stripped stdout ('' when git fails)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


def shares_code(path: str) -> bool:
    """A tracked file every method's training uses: train_accelerate.py and adaptive/ outside adaptive/timesteps/."""
    inside = path.startswith("adaptive/") and not path.startswith("adaptive/timesteps/")
    return path.endswith(".py") and (path == "train_accelerate.py" or inside)


def code_hash() -> str:
    """Hash of the code every method shares (working tree), without the method-specific config lines
    (`adaptive_*`, `speed_*`, `uncertainty_lr`). Rows of one table must share it: only the method under test may
    differ."""
    h = hashlib.sha256()
    for f in sorted(git("ls-files").splitlines()):
        p = ROOT / f
        if shares_code(f) and p.exists():
            lines = p.read_text().splitlines()
            if f == "adaptive/config.py" or f.startswith("adaptive/config/"):
                lines = [line for line in lines if not line.strip().startswith(METHOD_CONFIG_LINES)]
            h.update(f.encode() + b"\0" + "\n".join(lines).encode())
    return h.hexdigest()[:16]


def dirty() -> bool:
    """Tracked files differ from the commit."""
    return bool(git("status", "--porcelain", "--untracked-files=no"))


def machine() -> dict:
    """CPU model (with its CPUID family/model where /proc/cpuinfo has it: hosts of one model name differ ~3x in speed),
    core count, native bf16, and platform."""
    model = platform.processor()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except Exception:
        pass
    info = cpuinfo()
    if "cpu family" in info and "model" in info:
        model = f"{model} (CPUID family {info['cpu family']} model {info['model']})"
    flags = set(info.get("flags", "").split())
    return {"cpu": model, "cores": os.cpu_count(), "native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
            "platform": platform.platform()}


def cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def versions() -> dict:
    """Python, torch, diffusers and accelerate versions."""
    import accelerate  # slow imports (seconds): only when a report records them
    import diffusers
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "accelerate": accelerate.__version__}


def without_method_options(extra: list[str]) -> list[str]:
    """`extra` without the options of a timestep method (`--adaptive_balance 0`, `--snr_gamma=5`): they do not
    change the model, and the default method would refuse them."""
    from adaptive.timesteps.registry import owner_of

    out, skip = [], False
    for a in extra:
        name = a[2:].split("=", 1)[0] if a.startswith("--") else None
        if skip:
            skip = False
        elif name is not None and owner_of(name) is not None:
            skip = "=" not in a
        else:
            out.append(a)
    return out


def model_of(preset: str, extra: list[str]) -> dict:
    """The model a table's runs train (PROTOCOL.md v4: every results.json names it): the preset with the runs' extra
    flags applied -> block_out_channels, layers_per_block, norm_num_groups, channels per group at the narrowest
    level, attention blocks, dropout and the parameter count."""
    from adaptive.config import OneLineParser, add_config_arguments, resolve_config
    from adaptive.model import build_unet, count_parameters

    argv = ["--preset", preset, *without_method_options(extra)]
    parser = OneLineParser(prog="model_of")
    add_config_arguments(parser, argv)
    args, _ = parser.parse_known_args(argv)
    cfg = resolve_config(args)
    return {"preset": preset, "resolution": cfg.resolution, "block_out_channels": list(cfg.block_out_channels),
            "layers_per_block": cfg.layers_per_block, "norm_num_groups": cfg.norm_num_groups,
            "min_channels_per_group": min(cfg.block_out_channels) // cfg.norm_num_groups,
            "down_block_types": list(cfg.down_block_types), "dropout": cfg.dropout,
            "parameters": count_parameters(build_unet(cfg))}
