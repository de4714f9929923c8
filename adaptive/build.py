"""Everything one optimizer step works with, built once: accelerator, data, model, EMA, optimizer, LR schedule,
timestep sampler (`setup` -> `Run`). Also used by benchmarks/ to time each method's real step side by side."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

import torch

from .attention import configure_attention
from .checkpoint import Progress, TrainState
from .config import ConfigError, TrainConfig, replace
from .data import Layout, TrainData, load_train_data
from .ema import EMA
from .faults import LaunchError, agree
from .fid import check_feature_network
from .losses import DiffusionTables
from .model import build_noise_scheduler, build_unet
from .phema import PowerEMAs
from .rundir import lock_output_dir
from .seeding import seed_for
from .trackers import check_installed
from .stats import Stats
from .timesteps import build_sampler
from .timesteps.base import TimestepSampler

if TYPE_CHECKING:  # for the annotations only; the code imports them where it builds them
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from diffusers import DDPMScheduler


@dataclass
class Run:
    """The built training run. `model` is the accelerate-prepared wrapper of the bare U-Net `unet`."""

    cfg: TrainConfig  # resolved (mixed precision filled in from the accelerator)
    accelerator: Accelerator
    layout: Layout
    data: TrainData
    unet: torch.nn.Module
    model: torch.nn.Module
    noise_scheduler: DDPMScheduler
    tables: DiffusionTables
    timesteps: TimestepSampler
    ema: Optional[EMA]
    phema: Optional[PowerEMAs]
    optimizer: AcceleratedOptimizer
    lr_scheduler: AcceleratedScheduler
    max_steps: int
    progress: Progress = field(default_factory=Progress)
    stats: Stats = field(default_factory=Stats)
    lock: Optional[TextIO] = None  # the output folder's lock file, held for the run's lifetime (main process)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN computes bf16 in hardware on this CPU (AVX512-BF16 or AMX); elsewhere bf16 autocast is
    emulated."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    check_installed(cfg.logger)
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        mixed_precision=cfg.mixed_precision,
        log_with=None if cfg.logger == "none" else cfg.logger,
        project_config=ProjectConfiguration(project_dir=cfg.output_dir,
                                            logging_dir=os.path.join(cfg.output_dir, cfg.logging_dir)),
        step_scheduler_with_optimizer=False,  # we step the LR schedule once per optimizer step, whatever the world size
        # how long a collective waits for a stopped or wedged rank before failing (a dead rank fails it at once)
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=cfg.ddp_timeout_minutes))],
    )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise LaunchError(
            f"{launched} processes were launched but they did not join one process group; on a CPU host run "
            "ACCELERATE_USE_CPU=1 accelerate launch --config_file accelerate_configs/cpu_2proc.yaml ..."
        )
    if accelerator.device.type == "cpu" and accelerator.mixed_precision == "fp16":
        raise ConfigError("--mixed_precision fp16 needs a GPU; use bf16 on the CPU")
    return accelerator


def raise_on_every_rank(accelerator, main_error: Optional[str]) -> None:
    """ConfigError(main_error of the main process) on every rank (one broadcast), so that no rank waits for a failed
    one in a later collective."""
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        main_error = broadcast_object_list([main_error], from_process=0)[0]
    if main_error:
        raise ConfigError(main_error)


def check_buildable(cfg: TrainConfig) -> None:
    """Build the U-Net and run one forward pass on the meta device (no memory, no compute, ~0.2 s), and the optimizer
    on one tensor: flags that Diffusers or torch refuse become a one-line ConfigError before anything is loaded or
    written; with evaluation on, that its feature network can be had."""
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.device("meta"):
            warnings.simplefilter("ignore")
            unet = build_unet(cfg).eval()
            unet(torch.zeros(1, 3, cfg.resolution, cfg.resolution), torch.zeros(1, dtype=torch.long))
    except Exception as e:
        raise ConfigError("the U-Net cannot be built from --block_out_channels/--down_block_types/--up_block_types/"
                          f"--attention_head_dim/--norm_num_groups/--layers_per_block: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    try:
        build_optimizer(cfg, [torch.zeros(1, requires_grad=True)])
    except ValueError as e:
        raise ConfigError(f"the optimizer refuses these settings: {e}") from None
    if cfg.eval_steps or cfg.eval_at_steps:  # before any data is decoded (the evaluator loads it much later)
        check_feature_network(cfg.eval_feature_extractor, "--eval_feature_extractor")


def apply_optimizer_settings(run: Run) -> None:
    """After a resume: the optimizer and LR schedule come back with the hyper-parameters they were saved with; the
    configured ones apply from the resumed step on (the schedule's shape, warm-up and horizon already follow the
    flags). Only values that differ are touched, so an unchanged resume stays bit-identical."""
    cfg, schedule = run.cfg, getattr(run.lr_scheduler, "scheduler", run.lr_scheduler)
    settings = {"betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon,
                "weight_decay": cfg.adam_weight_decay}
    for i, group in enumerate(run.optimizer.param_groups):
        for key, value in settings.items():
            if (tuple(group[key]) if key == "betas" else group[key]) != value:
                group[key] = value
        if schedule.base_lrs[i] != cfg.learning_rate:
            schedule.base_lrs[i] = group["initial_lr"] = cfg.learning_rate
            group["lr"] = cfg.learning_rate * schedule.lr_lambdas[i](schedule.last_epoch)  # what LambdaLR computes
            schedule._last_lr[i] = group["lr"]


def build_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    """AdamW (= Adam with weight decay 0, as DDPM), foreach kernels."""
    return torch.optim.AdamW([{"params": list(params), "weight_decay": cfg.adam_weight_decay}], lr=cfg.learning_rate,
                             betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon, foreach=True)


def planned_steps(cfg: TrainConfig, num_images: int, layout: Layout) -> int:
    """Optimizer steps of the run: --max_train_steps, or --num_epochs over the (first --max_train_samples) images.
    Needs only the image count, so a finished run is recognised before its data is decoded."""
    if cfg.max_train_steps is not None:
        return cfg.max_train_steps
    n = num_images if cfg.max_train_samples is None else min(num_images, cfg.max_train_samples)
    return cfg.num_epochs * -(-n // layout.global_batch)


def prepare_output_dir(accelerator, cfg: TrainConfig, log):
    """Main process: create the folder and lock it for the run's lifetime (returns the lock); every rank raises if
    that failed. Nothing is cleared here: a replaced run is cleared right before training (session.start_session)."""
    out, lock, error = Path(cfg.output_dir), None, None
    if accelerator.is_main_process:
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock = lock_output_dir(out, log)
        except OSError as e:
            error = ConfigError(f"cannot create --output_dir {out}: {e.strerror}")
        except ConfigError as e:
            error = e
    agree(accelerator, error)
    return lock


def build_model(cfg: TrainConfig, device: torch.device):
    """(U-Net with the attention kernel for the device, noise scheduler, per-t tables); identical weights on every
    rank."""
    if device.type == "cuda" and cfg.allow_tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(seed_for(cfg.seed, "init"))  # identical initial weights on every rank
    unet = configure_attention(build_unet(cfg), cfg.attention_impl, device.type)
    if cfg.channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    noise_scheduler = build_noise_scheduler(cfg)
    return unet, noise_scheduler, DiffusionTables.build(noise_scheduler.alphas_cumprod, cfg, device)


def setup(cfg: TrainConfig, log, entries=None, main_error: Optional[str] = None,
          layout: Optional[Layout] = None) -> Run:
    """Accelerator, data on the device, model, noise schedule, timestep sampler, EMA, optimizer, LR schedule; the
    TrainState registered with the accelerator (so save_state/load_state carry it). `main_error`: a check that only
    the main process made failed (the Hub check, `hub.connect_hub`): raised on every rank before anything is
    written. `layout`: the batch layout train() planned with (the launch's WORLD_SIZE, which make_accelerator has
    checked against the process group); made here for callers without one."""
    from diffusers.optimization import get_scheduler

    # Set up the accelerator and load the data onto the device.
    accelerator = make_accelerator(cfg)
    if cfg.push_to_hub:
        raise_on_every_rank(accelerator, main_error)
    cfg = replace(cfg, mixed_precision=accelerator.mixed_precision)
    device = accelerator.device
    accelerator.wait_for_everyone()  # every rank has checked its input before anything is written
    layout = layout or Layout(cfg.train_batch_size, accelerator.num_processes, cfg.gradient_accumulation_steps)
    with accelerator.main_process_first():
        data = load_train_data(cfg, layout, accelerator.process_index, device, entries, log)
    lock = prepare_output_dir(accelerator, cfg, log)

    # Build the model, timestep sampler, EMA, optimizer and LR schedule.
    unet, noise_scheduler, tables = build_model(cfg, device)
    timesteps = build_sampler(cfg, device, tables)
    ema = None
    if cfg.use_ema:
        ema = EMA(unet, cfg.ema_max_decay, cfg.ema_min_decay, cfg.ema_warmup, cfg.ema_inv_gamma, cfg.ema_power)
        ema.model.to(device)
    optimizer = build_optimizer(cfg, unet.parameters())
    max_steps = planned_steps(cfg, data.num_images, layout)
    lr_scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.lr_warmup_steps,
                                 num_training_steps=max_steps)
    phema = PowerEMAs(unet, cfg.ema_snapshots).to(device) if cfg.ema_snapshots else None
    if cfg.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    if cfg.compile:
        unet.compile()  # in place: the parameters and state_dict keys stay those of the bare U-Net
    model, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    run = Run(cfg, accelerator, layout, data, unet, model, noise_scheduler, tables, timesteps, ema, phema, optimizer,
              lr_scheduler, max_steps, lock=lock)
    TrainState(run.progress, timesteps, ema, phema).register(accelerator)
    return run


def run_fraction(run: Run, step: int) -> float:
    """Share of the run done: steps / max steps, or the spent share of --max_train_minutes if that is larger
    (then it depends on the clock, so runs with a wall-clock budget are not bit-reproducible - they never are)."""
    frac = step / max(1, run.max_steps)
    if run.cfg.max_train_minutes:
        frac = max(frac, run.progress.train_seconds / (60 * run.cfg.max_train_minutes))
    return min(1.0, frac)
