#!/usr/bin/env python
"""Where a checkpoint's denoising error sits, by noise level and spatial frequency (a development diagnostic).

For images x0 of the training set, noise eps and a grid of timesteps t, the model's epsilon error e = eps_hat - eps
is mapped to the error of its clean-image estimate, e_x0 = -sqrt((1 - abar_t) / abar_t) e (Ho et al. 2020, eq. 15:
x0_hat = (x_t - sqrt(1 - abar_t) eps_hat) / sqrt(abar_t)), and split by radial spatial frequency in cycles per
image (|k| <= 0.5: the image mean; then bands 1, 2, 4, 8, 16 and above), per channel, with Parseval's identity
(mean over pixels of e^2 = sum_k |F_k|^2 / N^2). Each band's error power is reported beside the power of the data
in that band, E|F(x0 - mean image)|^2: an x0 estimate whose error in a band exceeds the data's own power there is
worse than predicting the data mean. `dc_slope` is the regression slope of the prediction's per-channel image mean on
the noise's (1: the model reproduces the noise's mean colour, as it must at high noise; 0: it predicts a zero-mean
noise, and x0_hat's mean colour is the noise's mean amplified by 1/sqrt(abar_t)). Ancestral sampling uses x0_hat
(clipped to [-1, 1]) at every step, so a band that stays wrong at high noise is what the samples show - colour blobs
when it is the low frequencies.

Bands are in cycles per image, so a 16 px and a 32 px model are compared at the same scale of structure.

    python benchmarks/error_spectrum.py --checkpoint RUN/checkpoint-1000 \
        --data ../shared/datasets/cifar10-jpeg/train.zip --out docs/benchmarks/dev/<date>/spectrum_<name>.json
    python benchmarks/error_spectrum.py --summarize A.json B.json      # markdown tables

Diagnostic only: nothing in training depends on it.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from adaptive.checkpoint import load_ema_weights, read_config
from adaptive.config import TrainConfig
from adaptive.data import decode_all, open_entries, to_model_input
from adaptive.model import build_noise_scheduler, build_unet
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

BAND_EDGES = (0.5, 1.5, 2.5, 4.5, 8.5, 16.5)  # radial |k| in cycles per image; bands: [0, 0.5], (0.5, 1.5], ...
BAND_NAMES = ("mean", "1", "2", "3-4", "5-8", "9-16", ">16")
TIMESTEPS = (999, 950, 900, 800, 700, 600, 500, 400, 300, 200, 100, 50, 10)


def radial_band(size: int) -> torch.Tensor:
    """[S, S] band index of each 2-D frequency of an S x S image (radial |k| in cycles per image)."""
    k = torch.fft.fftfreq(size) * size
    r = (k[:, None] ** 2 + k[None, :] ** 2).sqrt()
    return torch.bucketize(r, torch.tensor(BAND_EDGES), right=False)


def band_power(x: torch.Tensor, band: torch.Tensor) -> torch.Tensor:
    """Mean over images and channels of the per-pixel power of x [N, C, S, S] in each band (Parseval): [n_bands]."""
    S = x.shape[-1]
    f = torch.fft.fft2(x.double()).abs().pow(2) / S ** 4  # sum over k of this = mean over pixels of x^2
    per = torch.zeros(len(BAND_NAMES), dtype=torch.float64).index_add_(0, band.flatten(), f.mean((0, 1)).flatten())
    return per.float()


@torch.no_grad()
def measure(model, x0: torch.Tensor, abar: torch.Tensor, timesteps, batch: int, gen: torch.Generator) -> dict:
    """Per t: eps-MSE, and the x0-estimate's error power per frequency band."""
    band = radial_band(x0.shape[-1])
    out = {}
    for t in timesteps:
        a = abar[t]
        err_eps, err_x0, dc_true, dc_pred = 0.0, torch.zeros(len(BAND_NAMES)), [], []
        for i in range(0, len(x0), batch):
            x = x0[i:i + batch]
            eps = torch.randn(x.shape, generator=gen)
            xt = a.sqrt() * x + (1 - a).sqrt() * eps
            pred = model(xt, torch.full((len(x),), t)).sample.float()
            e = pred - eps
            err_eps += float(e.pow(2).mean()) * len(x) / len(x0)
            err_x0 += band_power(e * ((1 - a) / a).sqrt(), band) * len(x) / len(x0)
            dc_true.append(eps.mean((2, 3)).flatten())
            dc_pred.append(pred.mean((2, 3)).flatten())
        u, v = torch.cat(dc_true), torch.cat(dc_pred)
        out[t] = {"eps_mse": err_eps, "x0_error_by_band": err_x0.tolist(),
                  "dc_slope": float((u * v).mean() / u.pow(2).mean())}
    return out


def summarize(paths: list[Path]) -> str:
    """Markdown: per file, the x0 error / data power per band and t (< 1: better than the data mean)."""
    lines = []
    for path in paths:
        r = json.loads(path.read_text())
        data = torch.tensor(r["data_power_by_band"])
        lines += [f"**{path.name}** ({r['resolution']} px, step {r['step']}, {r['images']} images; weights "
                  f"{r['weights']}). x0-estimate error power / data power per band (cycles per image); eps-MSE:", "",
                  "| t | eps-MSE | DC slope | " + " | ".join(BAND_NAMES) + " |",
                  "|---|---|---|" + "---|" * len(BAND_NAMES)]
        for t, v in r["by_t"].items():
            ratio = torch.tensor(v["x0_error_by_band"]) / data.clamp_min(1e-12)
            lines.append(f"| {t} | {v['eps_mse']:.5f} | {v.get('dc_slope', float('nan')):.3f} | "
                         + " | ".join(f"{x:.3g}" for x in ratio.tolist()) + " |")
        lines.append("")
    return "\n".join(lines)


def run_label(checkpoint: str) -> str:
    """The run a measured checkpoint belongs to: its run folder's name (RUN/checkpoint-N), or, for a checkpoint
    copied out under a name of its own (KEEP/<run>-N), that name without its step."""
    path = Path(checkpoint)
    if re.fullmatch(r"checkpoint-\d+", path.name):
        return path.parent.name
    return re.sub(r"-\d+$", "", path.name)


def plot_dc_slope(paths: list[Path], out: Path, high_t: int = 700) -> None:
    """DC slope (mean over the measured t >= high_t) against the checkpoint's step, one line per run folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, list[tuple[int, float]]] = {}
    for path in paths:
        r = json.loads(path.read_text())
        slopes = [v["dc_slope"] for t, v in r["by_t"].items() if int(t) >= high_t and "dc_slope" in v]
        name = f"{run_label(r['checkpoint'])} ({r['resolution']} px)"
        runs.setdefault(name, []).append((r["step"], sum(slopes) / len(slopes)))
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, pts in sorted(runs.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"DC slope (mean over t >= {high_t})")
    ax.set_title("Does the model reproduce the noise's mean colour? (0 = no: colour blobs)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summarize", type=Path, nargs="+", help="only print markdown tables of these result files")
    ap.add_argument("--plot", type=Path, help="with --summarize: also plot each run's DC slope against its step here")
    ap.add_argument("--checkpoint", type=Path, help="an accelerate checkpoint folder of a training run")
    ap.add_argument("--weights", choices=["ema", "online"], default="ema", help="the EMA (what is sampled) or online")
    ap.add_argument("--data", type=Path, help="the training images (zip or folder)")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--timesteps", type=int, nargs="+", default=list(TIMESTEPS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        if args.plot:
            plot_dc_slope(args.summarize, args.plot)
        return 0
    if not (args.checkpoint and args.data and args.out):
        ap.error("--checkpoint, --data and --out are required (or --summarize FILES)")
    raw = read_config(args.checkpoint)
    cfg = TrainConfig.from_dict({**{k: v for k, v in raw.items() if k in TrainConfig.__dataclass_fields__},
                                 "train_data_dir": str(args.data)})
    model = build_unet(cfg)
    if args.weights == "ema":
        model.load_state_dict(load_ema_weights(args.checkpoint))
    else:
        from safetensors.torch import load_file  # only this branch needs it
        model.load_state_dict(load_file(str(args.checkpoint / "model.safetensors")))
    model.eval()
    gen = torch.Generator().manual_seed(args.seed)
    x0 = to_model_input(decode_all(open_entries(cfg), cfg.resolution, limit=args.images), None, cfg.resolution)
    abar = build_noise_scheduler(cfg).alphas_cumprod.double()
    data = band_power(x0 - x0.mean(0, keepdim=True), radial_band(cfg.resolution))
    result = {"checkpoint": str(args.checkpoint), "step": int(args.checkpoint.name.rsplit("-", 1)[-1]),
              "resolution": cfg.resolution, "images": len(x0), "weights": args.weights, "bands": list(BAND_NAMES),
              "data_power_by_band": data.tolist(),
              "by_t": measure(model, x0, abar.float(), args.timesteps, args.batch, gen)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(summarize([args.out]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
