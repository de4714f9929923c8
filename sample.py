#!/usr/bin/env python
"""Generate images from a trained DDPMPipeline, one seed per image, on any number of processes.

    accelerate launch sample.py --model_path runs/x --num_images 10000 --output_dir samples/x
    accelerate launch sample.py --model_path runs/x --num_inference_steps 100 --output_dir samples/x-100 --npz
    python sample.py --model_path runs/x/checkpoint-2000 --like_run runs/x --output_dir samples/x-2000

Image i comes from torch.Generator seed `--seed_offset + i` (initial noise and every step's noise), so the images do
not depend on --batch_size or on the number of processes. Output: output_dir/images/000000.png ... (one PNG per
image, what clean-fid reads), grid.png (the first 64), optional samples.npz (arr_0: uint8 [N, H, W, 3]) and
sampling.json. Rerunning the same command generates only the missing images. --like_run RUN takes the image count,
seeds, steps, batch size, precision and attention kernel of RUN's in-training evaluation (docs/evaluation.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from adaptive.config import CHOICES, ConfigError, OneLineParser, fill_like_run, like_run_help, load_run_config
from adaptive.faults import check_output_path, run_cli

GRID_IMAGES = 64
# a resumed run shares these
IDENTITY_KEYS = ("model_path", "weights", "scheduler", "num_inference_steps", "seed_offset")
# --like_run RUN samples as RUN's in-training evaluation did (always DDPM ancestral, the default --scheduler): the flags
# not given take these fields of its config. flag: (default without --like_run, the run config's field)
LIKE_RUN = {
    "num_images": (10_000, "eval_num_images"),
    "seed_offset": (0, "eval_seed_offset"),
    "num_inference_steps": (1000, "eval_inference_steps"),
    "batch_size": (256, "eval_batch_size"),
    "mixed_precision": (None, "mixed_precision"),
    "attention_impl": ("auto", "attention_impl"),
}


def parse_args(argv=None):
    p = OneLineParser(prog="sample.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_path", required=True,
                   help="a training output_dir (its exported pipeline, or its newest checkpoint before the export), a "
                        "checkpoint-<step> folder, or a Hub id")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema",
                   help="ema: the EMA U-Net (what the run exports); raw: the training weights of a checkpoint")
    p.add_argument("--output_dir", required=True, help="where images/, grid.png, samples.npz, sampling.json go")
    p.add_argument("--like_run", default=None,
                   help="a training run (or checkpoint) folder: sample as its in-training evaluation did - the flags "
                        "marked --like_run below take the run's values unless given")
    p.add_argument("--num_images", type=int, default=None,
                   help=like_run_help("images to generate (indices 0 .. N-1)", "num_images", LIKE_RUN))
    p.add_argument("--seed_offset", type=int, default=None,
                   help=like_run_help("image i is generated from seed seed_offset + i", "seed_offset", LIKE_RUN))
    p.add_argument("--num_inference_steps", type=int, default=None,
                   help=like_run_help("sampling steps; fewer than the model's T gives respaced DDPM ancestral sampling",
                                      "num_inference_steps", LIKE_RUN))
    p.add_argument("--scheduler", choices=("ddpm", "ddim"), default="ddpm",
                   help="ddpm (ancestral, the protocol) or ddim (deterministic, eta 0; not the DDPM protocol)")
    p.add_argument("--batch_size", type=int, default=None,
                   help=like_run_help("images per device per batch", "batch_size", LIKE_RUN))
    p.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default=None,
                   help="autocast of the U-Net [default: the accelerate config's choice; --like_run: the run's "
                        "mixed_precision]")
    p.add_argument("--attention_impl", choices=CHOICES["attention_impl"], default=None,
                   help=like_run_help("attention kernel (adaptive/attention.py; auto = the fastest for the device)",
                                      "attention_impl", LIKE_RUN))
    p.add_argument("--compile", action="store_true", help="torch.compile the U-Net (compiles once per batch shape)")
    p.add_argument("--npz", action="store_true", help="also write samples.npz (arr_0: uint8 [N, H, W, 3], index order)")
    p.add_argument("--overwrite", action="store_true", help="replace samples made with other settings in output_dir")
    return p.parse_args(argv)


def resolve_args(args):
    """The flags not given from --like_run's config, else their defaults."""
    return fill_like_run(args, LIKE_RUN, load_run_config(args.like_run) if args.like_run else None)


def check_args(args) -> None:
    for name in ("num_images", "batch_size", "num_inference_steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.seed_offset < 0:
        raise ConfigError(f"--seed_offset must be >= 0 (got {args.seed_offset})")
    check_output_path(Path(args.output_dir), "--output_dir")


def load_pipeline(model_path: str, weights: str = "ema"):
    """adaptive.pipelines.load_pipeline with Diffusers' loading bar silenced (noise on the sampling's stderr)."""
    from diffusers.utils import logging as diffusers_logging

    from adaptive.pipelines import load_pipeline as load  # imports torch: keeps --help fast

    was_enabled = diffusers_logging.is_progress_bar_enabled()
    diffusers_logging.disable_progress_bar()
    try:
        return load(model_path, weights, log=lambda m: print(m, file=sys.stderr))
    finally:
        if was_enabled:
            diffusers_logging.enable_progress_bar()


def sampling_record(args, scheduler_config) -> dict:
    """The settings that identify a sample set (IDENTITY_KEYS first), written to sampling.json."""
    from adaptive.image_sampler import image_sampler_label  # imports torch: keeps --help fast

    model = Path(args.model_path).expanduser()
    steps_t = scheduler_config["num_train_timesteps"]
    if not 1 <= args.num_inference_steps <= steps_t:
        raise ConfigError(f"--num_inference_steps must be between 1 and the model's {steps_t} diffusion steps "
                          f"(got {args.num_inference_steps})")
    return {"model_path": str(model.resolve()) if model.exists() else args.model_path, "weights": args.weights,
            "scheduler": args.scheduler,
            "num_inference_steps": args.num_inference_steps, "seed_offset": args.seed_offset,
            "sampler": image_sampler_label(args.scheduler), "num_train_timesteps": steps_t}


def check_existing(out: Path, record: dict, overwrite: bool) -> bool:
    """True if output_dir holds samples to replace; ConfigError if they were made differently and not --overwrite."""
    info, images = out / "sampling.json", out / "images"
    if info.exists():
        try:
            old = json.loads(info.read_text())
        except (OSError, ValueError) as e:
            old = {"unreadable": str(e)}
        old.setdefault("weights", "ema")  # sample sets made before --weights existed
        diff = [k for k in IDENTITY_KEYS if old.get(k) != record[k]]
        if not diff:
            return False
        if not overwrite:
            what = ", ".join(f"{k} {old.get(k)!r} != {record[k]!r}" for k in diff)
            raise ConfigError(f"{out} holds samples made with other settings ({what}); "
                              "pass --overwrite to replace them")
        return True
    if images.is_dir() and any(images.iterdir()):
        if not overwrite:
            raise ConfigError(f"{images} holds images but {out} has no sampling.json; pass --overwrite to replace them")
        return True
    return False


def clear_outputs(out: Path) -> None:
    shutil.rmtree(out / "images", ignore_errors=True)
    for name in ("grid.png", "samples.npz", "sampling.json"):
        (out / name).unlink(missing_ok=True)


def png_path(images_dir: Path, i: int) -> Path:
    return images_dir / f"{i:06d}.png"


def write_pngs(images, indices, images_dir: Path) -> None:
    """uint8 [B, H, W, 3] -> images_dir/<index>.png, each written atomically (a resumed run trusts existing files)."""
    from PIL import Image

    for img, i in zip(images.numpy(), indices):
        path = png_path(images_dir, i)
        tmp = path.with_name(path.name + ".tmp")
        Image.fromarray(img).save(tmp, format="PNG")
        os.replace(tmp, path)


def read_pngs(images_dir: Path, n: int):
    """uint8 [n, H, W, 3] of images 0 .. n-1."""
    import numpy as np
    from PIL import Image

    return np.stack([np.asarray(Image.open(png_path(images_dir, i)).convert("RGB")) for i in range(n)])


def generate(accelerator, unet, scheduler_config, todo: list[int], args, images_dir: Path) -> None:
    """This rank's contiguous share of the indices `todo`, in batches, each batch written as PNGs."""
    from adaptive.image_sampler import ddpm_sample  # imports torch: keeps --help fast
    from adaptive.progress import progress  # keeps --help fast

    world = accelerator.num_processes
    with accelerator.split_between_processes(todo) as mine:  # no padding: ranks never talk while generating
        mine = list(mine)
    bar = progress(len(todo), "sampling", "img", enabled=accelerator.is_main_process)
    done = 0
    for start in range(0, len(mine), args.batch_size):
        idx = mine[start : start + args.batch_size]
        imgs = ddpm_sample(unet, scheduler_config, [args.seed_offset + i for i in idx], args.num_inference_steps,
                           len(idx), accelerator.device, accelerator.autocast, args.scheduler)  # sync point: per batch
        write_pngs(imgs, idx, images_dir)
        bar.update(min(len(idx) * world, len(todo) - done))  # the main rank's pace stands for all ranks
        done += min(len(idx) * world, len(todo) - done)
    bar.close()


def finalize(out: Path, record: dict, npz: bool) -> dict:
    """Main process: grid of the first 64, optional samples.npz, the completed sampling.json."""
    import numpy as np

    from adaptive.image_sampler import save_grid  # imports torch: keeps --help fast

    n = record["num_images"]
    missing = [i for i in range(n) if not png_path(out / "images", i).exists()]
    if missing:
        raise RuntimeError(f"{len(missing)} images missing after sampling (first: {missing[0]})")
    grid = read_pngs(out / "images", min(n, GRID_IMAGES))
    save_grid(grid, out / "grid.png")
    if npz:
        tmp = out / "samples.tmp.npz"
        np.savez(tmp, arr_0=read_pngs(out / "images", n))
        os.replace(tmp, out / "samples.npz")
    record = {**record, "resolution": list(grid.shape[1:3]), "complete": True}
    write_json(out / "sampling.json", record)
    return record


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    return run_cli("sample.py", lambda: _check_and_run(parse_args(argv)))


def _check_and_run(args) -> int:
    args = resolve_args(args)
    check_args(args)
    run(args)
    return 0


def run(args) -> dict:
    import torch
    from accelerate import Accelerator

    from adaptive.attention import configure_attention  # imports torch: keeps --help fast
    from adaptive.image_sampler import compile_for_sampling, make_scheduler  # imports torch: keeps --help fast

    pipe = load_pipeline(args.model_path, args.weights)
    scheduler_config = make_scheduler(pipe.scheduler.config, "ddpm").config  # a DDPMScheduler config whatever was saved
    record = sampling_record(args, scheduler_config)
    out = Path(args.output_dir)
    replace = check_existing(out, record, args.overwrite)  # every rank checks, so every rank fails alike
    accelerator = Accelerator(mixed_precision=args.mixed_precision)

    # Prepare output_dir: the main process clears and records the settings before anything is generated.
    if accelerator.is_main_process:
        if replace:
            clear_outputs(out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        write_json(out / "sampling.json", {**record, "num_images": args.num_images, "complete": False})
    accelerator.wait_for_everyone()
    todo = [i for i in range(args.num_images) if not png_path(out / "images", i).exists()]
    accelerator.wait_for_everyone()  # every rank has listed the same missing images before any is written

    # Generate this rank's share.
    unet = pipe.unet.to(accelerator.device).eval().requires_grad_(False)
    configure_attention(unet, args.attention_impl, accelerator.device.type)  # the kernel (docs/performance.md)
    if accelerator.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    if args.compile:
        unet = compile_for_sampling(unet)
    t0 = time.perf_counter()
    generate(accelerator, unet, scheduler_config, todo, args, out / "images")
    accelerator.wait_for_everyone()
    seconds = time.perf_counter() - t0

    # Write the grid, npz and sampling.json.
    if accelerator.is_main_process:
        record = {**record, "num_images": args.num_images, "generated": len(todo), "seconds": round(seconds, 2),
                  "images_per_s": round(len(todo) / seconds, 2) if todo else None,
                  "mixed_precision": accelerator.mixed_precision, "world_size": accelerator.num_processes,
                  "batch_size": args.batch_size, "compile": args.compile}
        record = finalize(out, record, args.npz)
        skipped = args.num_images - len(todo)
        print(f"sampled {len(todo)} images ({skipped} already there) with {record['sampler']}, "
              f"{args.num_inference_steps} steps, in {seconds:.1f}s on {accelerator.num_processes} process(es) "
              f"-> {out}")
    accelerator.end_training()  # every rank: the process group is torn down here, not by the interpreter's exit
    return record


if __name__ == "__main__":
    sys.exit(main())
