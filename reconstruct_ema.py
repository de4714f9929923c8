#!/usr/bin/env python
"""Post-hoc EMA: rebuild the EMA of any length from a run's power-function EMA snapshots (Karras et al. 2024).

    python reconstruct_ema.py --run_dir runs/x --sigma_rel 0.08 --output_dir runs/x/phema-0.080

The run must have been trained with --ema_snapshots (e.g. 0.05 0.10). The result is a DDPMPipeline folder with a
model card (README.md: sigma_rel, the snapshots used) and phema.json (the coefficients).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from adaptive.config import ConfigError, OneLineParser, TrainConfig
from adaptive.faults import check_output_path, run_cli
from adaptive.model_card import write_model_card
from adaptive.progress import progress as progress_bar


def parse_args(argv=None):
    p = OneLineParser(prog="reconstruct_ema.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--run_dir", required=True, help="training output_dir with config.json and ema_snapshots/")
    p.add_argument("--sigma_rel", type=float, nargs="+", required=True,
                   help="EMA length(s) to reconstruct (relative std)")
    p.add_argument("--at_step", type=int, default=None,
                   help="optimizer step to reconstruct at [default: the last snapshot]")
    p.add_argument("--output_dir", default=None, help="where to write the pipeline [default: run_dir/phema-<sigma>]")
    p.add_argument("--extrapolate", action="store_true",
                   help="allow a --sigma_rel outside the snapshots' range (EDM2: reconstruction is reliable only "
                        "between the shortest and longest snapshot; outside it the result is an extrapolation)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a pipeline already in the output folder (e.g. the run's own export in run_dir)")
    return p.parse_args(argv)


def check_in_range(sigma_rel: float, snaps: list[dict], extrapolate: bool) -> None:
    """A sigma_rel outside the snapshots' [shortest, longest] is refused, or with --extrapolate warned about."""
    low, high = min(s["sigma_rel"] for s in snaps), max(s["sigma_rel"] for s in snaps)
    if low <= sigma_rel <= high:
        return
    why = (f"--sigma_rel {sigma_rel:g} is outside the snapshots' range {low:g}-{high:g}: the reconstruction would "
           "extrapolate beyond what training kept")
    if not extrapolate:
        raise ConfigError(f"{why}; choose a value in the range, or pass --extrapolate to accept it")
    print(f"reconstruct_ema.py: warning: {why} (--extrapolate)", file=sys.stderr)


def export(run_dir: Path, sigma_rel: float, at_step, output_dir: Path, extrapolate: bool = False) -> dict:
    from diffusers import DDPMPipeline

    from adaptive.checkpoint import Progress  # imports torch: keeps --help fast
    from adaptive.model import build_noise_scheduler, build_unet  # imports torch: keeps --help fast
    from adaptive.phema import list_snapshots, reconstruct  # imports torch: keeps --help fast

    if not 0 < sigma_rel < 0.289:
        raise ConfigError(f"--sigma_rel {sigma_rel} must be in (0, 0.289)")
    snaps = list_snapshots(run_dir / "ema_snapshots")
    if not snaps:
        raise ConfigError(f"no snapshots in {run_dir / 'ema_snapshots'} (train with --ema_snapshots 0.05 0.10)")
    check_in_range(sigma_rel, snaps, extrapolate)
    if at_step is not None and at_step < min(s["step"] for s in snaps):
        raise ConfigError(f"--at_step {at_step} is before the first snapshot (step {min(s['step'] for s in snaps)})")
    try:
        cfg = TrainConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"--run_dir {run_dir}: config.json is not a run's config ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    used = [s for s in snaps if s["step"] <= (at_step or max(s["step"] for s in snaps))]  # what reconstruct combines
    try:
        with progress_bar(len(used), f"reconstruct_ema.py: sigma_rel {sigma_rel:g}: snapshots", unit="snapshot") as bar:
            state, coef = reconstruct(snaps, sigma_rel, at_step, on_loaded=lambda: bar.update(1))
        unet = build_unet(cfg)
        unet.load_state_dict(state)
    except Exception as e:  # safetensors, torch and numpy raise many types for a damaged or foreign snapshot
        raise ConfigError(f"cannot rebuild the EMA from the snapshots in {run_dir / 'ema_snapshots'}: "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    DDPMPipeline(unet=unet, scheduler=build_noise_scheduler(cfg)).save_pretrained(output_dir, safe_serialization=True)
    info = {"sigma_rel": sigma_rel, "at_step": at_step or max(s["step"] for s in snaps), "num_snapshots": len(coef),
            "coefficients": [float(c) for c in coef]}
    (output_dir / "phema.json").write_text(json.dumps(info, indent=2))
    run = run_info(run_dir)
    progress = Progress(step=info["at_step"], images_seen=info["at_step"] * run.get("global_batch", 0),
                        train_seconds=None)  # the run's clock at that step is not recorded
    write_model_card(output_dir, cfg, progress, run, posthoc={"sigma_rel": sigma_rel, "at_step": info["at_step"],
                                                              "snapshots": used})
    return info


def run_info(run_dir: Path) -> dict:
    """The run's run_info.json (world size, device, parameters, precision) for the model card; {} if unreadable."""
    try:
        return json.loads((run_dir / "run_info.json").read_text())
    except (OSError, ValueError):
        return {}


def main(argv=None) -> int:
    return run_cli("reconstruct_ema.py", lambda: reconstruct(parse_args(argv)))


def output_folders(args, run_dir: Path) -> list[Path]:
    """One folder per --sigma_rel; refuses the run folder itself or an existing pipeline without --overwrite."""
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"--run_dir {run_dir} has no config.json (not a training run)")
    outs = [Path(args.output_dir) if args.output_dir and len(args.sigma_rel) == 1 else
            Path(args.output_dir or run_dir) / f"phema-{s:.3f}" for s in args.sigma_rel]
    for out in outs:
        check_output_path(out, "--output_dir")
        own = out.resolve() == run_dir.resolve()
        if (own or (out / "model_index.json").exists()) and not args.overwrite:
            what = "is the run folder (its exported pipeline would be replaced)" if own else "already holds a pipeline"
            raise ConfigError(f"--output_dir {out} {what}; pass --overwrite to replace it, or choose another folder")
    return outs


def reconstruct(args) -> int:
    run_dir = Path(args.run_dir)
    outs = output_folders(args, run_dir)
    from adaptive.phema import list_snapshots  # imports torch: keeps --help fast

    snaps = list_snapshots(run_dir / "ema_snapshots")
    for s in args.sigma_rel if snaps else ():  # every value checked before the first pipeline is written
        if 0 < s < 0.289:
            check_in_range(s, snaps, args.extrapolate)
    for s, out in zip(args.sigma_rel, outs):
        info = export(run_dir, s, args.at_step, out, args.extrapolate)
        print(f"sigma_rel={s:g} at step {info['at_step']} from {info['num_snapshots']} snapshots -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
