"""The one training loop. Everything it needs is built by small helpers in this package."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import time
from types import SimpleNamespace
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import (STATE_FILE, changed_keys, incompatible_keys, list_checkpoints, load_object_state,
                         read_config, resolve_resume, save_checkpoint, save_object_state)
from .config import ConfigError, TrainConfig
from .control import StopControl
from .data import Layout, load_train_data, open_entries
from .ema import EMA
from .losses import DiffusionTables, per_sample_mse, q_sample, training_target
from .attention import configure_attention
from .model import build_noise_scheduler, build_unet, count_parameters
from .phema import PowerEMAs
from .sampling import generate_distributed, save_grid
from .seeding import generator, seed_for
from .stats import JsonlWriter, Stats
from .timesteps import build_sampler
from .timesteps.base import DIAGNOSTIC_BINS, bin_sum

HEATMAP_BINS = 50

RUN_MARKERS = ("config.json", "stats.jsonl", "model_index.json")
EXPORT_RECORD = "export.json"  # {"step": the exported pipeline's step, "metrics": its latest evaluation}


@dataclass
class Progress:
    """Where training is: the data position and clocks are pure functions of these."""

    step: int = 0  # optimizer steps done
    images_seen: int = 0  # global training images consumed
    train_seconds: float = 0.0  # wall-clock spent training (evaluation and previews excluded)

    def state_dict(self) -> dict:
        return {"step": self.step, "images_seen": self.images_seen, "train_seconds": self.train_seconds}

    def load_state_dict(self, s: dict) -> None:
        self.step, self.images_seen, self.train_seconds = int(s["step"]), int(s["images_seen"]), float(s["train_seconds"])


@dataclass
class TrainState:
    """Our part of a checkpoint, saved and restored by hooks registered with the Accelerator."""

    progress: Progress
    sampler: object
    ema: Optional[EMA] = None
    phema: Optional[PowerEMAs] = None

    def state_dict(self) -> dict:
        return {
            "progress": self.progress.state_dict(),
            "sampler": self.sampler.state_dict(),
            "ema_num_updates": self.ema.num_updates if self.ema else None,
            "phema": self.phema.state_dict() if self.phema else None,
        }

    def load_state_dict(self, s: dict) -> None:
        self.progress.load_state_dict(s["progress"])
        self.sampler.load_state_dict(s["sampler"])
        if self.ema is not None:
            self.ema.num_updates = int(s["ema_num_updates"])
        if self.phema is not None:
            if not s.get("phema"):
                raise ConfigError("the checkpoint has no post-hoc EMA state; resume without --ema_snapshots")
            self.phema.load_state_dict(s["phema"])

    def register(self, accelerator) -> None:
        """save_state/load_state then carry this state: training_state.pt (weights_only) and ema.safetensors."""
        from safetensors.torch import load_file, save_file

        def save_hook(models, weights, output_dir):
            if accelerator.is_main_process:
                save_object_state(Path(output_dir) / STATE_FILE, self.state_dict())
                if self.ema is not None:
                    sd = {k: v.detach().contiguous() for k, v in self.ema.model.state_dict().items()}
                    save_file(sd, str(Path(output_dir) / "ema.safetensors"))

        def load_hook(models, input_dir):
            self.load_state_dict(load_object_state(Path(input_dir) / STATE_FILE))
            if self.ema is not None:
                self.ema.model.load_state_dict(load_file(str(Path(input_dir) / "ema.safetensors")))

        accelerator.register_save_state_pre_hook(save_hook)
        accelerator.register_load_state_pre_hook(load_hook)


# ----------------------------------------------------------------------------------------------------------------
# Helpers, one job each.


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    if cfg.logger == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("--logger wandb needs the wandb package (pip install wandb)") from None
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        mixed_precision=cfg.mixed_precision,
        log_with=None if cfg.logger == "none" else cfg.logger,
        project_config=ProjectConfiguration(project_dir=cfg.output_dir,
                                            logging_dir=os.path.join(cfg.output_dir, cfg.logging_dir)),
        step_scheduler_with_optimizer=False,  # we step the LR schedule once per optimizer step, whatever the world size
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=1))],
    )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise ConfigError(
            f"{launched} processes were launched but they did not join one process group; on a CPU host run "
            "ACCELERATE_USE_CPU=1 accelerate launch --config_file accelerate_configs/cpu_2proc.yaml ..."
        )
    if accelerator.device.type == "cpu" and accelerator.mixed_precision == "fp16":
        raise ConfigError("--mixed_precision fp16 needs a GPU; use bf16 on the CPU")
    return accelerator


def run_holds_training(output_dir: Path) -> bool:
    return output_dir.is_dir() and (any((output_dir / m).exists() for m in RUN_MARKERS) or bool(list_checkpoints(output_dir)))


def check_output_dir(cfg: TrainConfig, log) -> Optional[Path]:
    """Decide what to do with output_dir before anything is written; returns the checkpoint to resume from."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output_dir {out} exists and is not a folder")
    if not run_holds_training(out):
        if cfg.resume_from_checkpoint not in (None, "latest"):
            return resolve_resume(out, cfg.resume_from_checkpoint, log)
        return None
    if cfg.overwrite_output_dir:
        return None
    if not cfg.resume_from_checkpoint:
        raise ConfigError(
            f"--output_dir {out} already holds a run; pass --resume_from_checkpoint latest to continue it or "
            "--overwrite_output_dir to replace it"
        )
    ckpt = resolve_resume(out, cfg.resume_from_checkpoint, log)
    saved_cfg_file = ckpt / "config.json" if ckpt else out / "config.json"
    if saved_cfg_file.exists():
        saved = json.loads(saved_cfg_file.read_text())
        bad = incompatible_keys(saved, cfg.to_dict())
        if bad:
            raise ConfigError(
                f"{saved_cfg_file.parent} was trained with a different model/objective ({', '.join(bad)} differ); "
                "use another --output_dir or --overwrite_output_dir"
            )
        changed = [k for k in changed_keys(saved, cfg.to_dict()) if k != "mixed_precision" or saved.get(k) != cfg.mixed_precision]
        if ckpt and changed:
            log(f"warning: resuming {ckpt.name} with changed settings: {', '.join(changed)}")
    return ckpt


def clear_run(out: Path) -> None:
    """Remove a previous run's artifacts from `out` (only with --overwrite_output_dir)."""
    for p in list_checkpoints(out) + [q for q in out.glob(".checkpoint-*.tmp")]:
        shutil.rmtree(p, ignore_errors=True)
    for name in ("config.json", "run_info.json", "stats.jsonl", "model_index.json", "README.md", EXPORT_RECORD):
        (out / name).unlink(missing_ok=True)
    (out / "timestep_p.png").unlink(missing_ok=True)
    for name in ("unet", "scheduler", "samples", "logs", "ema_snapshots"):
        shutil.rmtree(out / name, ignore_errors=True)


def run_info(accelerator, cfg: TrainConfig, layout: Layout, num_params: int, data) -> dict:
    import accelerate
    import diffusers

    return {
        "command": scrubbed_command(sys.argv),
        "world_size": accelerator.num_processes,
        "device": str(accelerator.device),
        "device_name": torch.cuda.get_device_name() if accelerator.device.type == "cuda" else platform.processor() or platform.machine(),
        "mixed_precision": accelerator.mixed_precision,
        "global_batch": layout.global_batch,
        "num_parameters": num_params,
        "num_images": data.num_images,
        "streaming": data.streaming,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__, "accelerate": accelerate.__version__,
                     "python": platform.python_version()},
        "git_commit": _git_commit(),
    }


def scrubbed_command(argv: list[str]) -> str:
    """The command line with the value of --hub_token replaced by ***."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
        elif a == "--hub_token":
            out.append(a)
            hide = True
        elif a.startswith("--hub_token="):
            out.append("--hub_token=***")
        else:
            out.append(a)
    return " ".join(out)


def _git_commit() -> Optional[str]:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except Exception:
        return None


def tracker_config(cfg: TrainConfig) -> dict:
    """Flat scalar config for trackers (TensorBoard hparams accept int/float/str/bool only); no secrets."""
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in cfg.to_dict().items()}


def build_optimizer(cfg: TrainConfig, params, extra_params) -> torch.optim.Optimizer:
    """AdamW (= Adam with weight decay 0, as DDPM); foreach kernels; sampler parameters join without weight decay."""
    groups = [{"params": list(params), "weight_decay": cfg.adam_weight_decay}]
    if extra_params:
        groups.append({"params": list(extra_params), "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_epsilon, foreach=True)


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    return cfg.max_train_steps if cfg.max_train_steps is not None else cfg.num_epochs * steps_per_epoch


def preview_grid(accelerator, cfg: TrainConfig, unet, noise_scheduler, step: int) -> Optional[Path]:
    """EMA sample grid from fixed seeds 0..N-1 (comparable over time); all ranks share the sampling."""
    images = generate_distributed(accelerator, unet, noise_scheduler.config, list(range(cfg.num_grid_images)),
                                  cfg.ddpm_num_inference_steps, batch_size=max(1, min(256, cfg.num_grid_images)))
    if accelerator.is_main_process:
        return save_grid(images, Path(cfg.output_dir) / "samples" / f"grid_{step:07d}.png")
    return None


def gather_for_sampler(accelerator, layout: Layout, losses: torch.Tensor, local_t: torch.Tensor,
                       t_all: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(t [G], loss [G]) of the global batch on every rank, in the (micro, rank, i) order of the global draw."""
    world = accelerator.num_processes
    if world == 1:
        return (t_all if t_all is not None else local_t), losses
    def order(x):  # gather is rank-major [world, accum * B]; the global draw is (micro, rank, i)
        return accelerator.gather(x).view(world, layout.accum, layout.batch_size).transpose(0, 1).reshape(-1)
    return (t_all if t_all is not None else order(local_t)), order(losses)


def sampler_diagnostics(sampler, p_history: list, step: int) -> dict:
    """The sampler's per-t diagnostics as plain numbers (one host sync), and a row of the p(t) heat-map history."""
    diag = sampler.diagnostics()
    p_fine = bin_sum(sampler.probabilities(), HEATMAP_BINS)
    names = sorted(diag)
    flat = torch.cat([diag[n].reshape(-1).float() for n in names] + [p_fine.float()]).tolist()  # sync point: log step
    out, pos = {}, 0
    for n in names:
        size = diag[n].numel()
        out[n] = flat[pos] if diag[n].dim() == 0 else flat[pos : pos + size]
        pos += size
    p_history.append((step, flat[pos:]))
    return out


def tracker_values(record: dict) -> dict:
    """Scalars for the trackers; per-bin lists become name/bin_i."""
    out = {}
    for k, v in record.items():
        if k == "step":
            continue
        if isinstance(v, list):
            out.update({f"timesteps/{k}_{i}": x for i, x in enumerate(v) if x is not None})
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def save_heatmap(accelerator, cfg: TrainConfig, p_history: list) -> None:
    if accelerator.is_main_process and p_history:
        from .plots import save_p_heatmap

        steps = [s for s, _ in p_history]
        save_p_heatmap(steps, [p for _, p in p_history], cfg.ddpm_num_steps, Path(cfg.output_dir) / "timestep_p.png",
                       title=f"p(t) over training - {cfg.timestep_sampler}")


def make_uploader(cfg: TrainConfig, log):
    """Background Hub uploader for the exported pipeline (main process only)."""
    from .hub import HubUploader, resolve_token

    repo_id = cfg.hub_model_id or Path(cfg.output_dir).resolve().name
    return HubUploader(repo_id, resolve_token(cfg.hub_token), private=cfg.hub_private_repo,
                       push_checkpoints=cfg.push_checkpoints, log=log)


def export_pipeline(accelerator, cfg: TrainConfig, unet, noise_scheduler, progress: Progress, info: dict,
                    metrics: Optional[dict] = None) -> None:
    """DDPMPipeline(unet=EMA U-Net, scheduler).save_pretrained(output_dir) in safetensors, with a model card."""
    if not accelerator.is_main_process:
        return
    from diffusers import DDPMPipeline

    from .model_card import write_model_card

    pipeline = DDPMPipeline(unet=unet, scheduler=noise_scheduler)
    pipeline.save_pretrained(cfg.output_dir, safe_serialization=True)
    write_model_card(Path(cfg.output_dir), cfg, progress, info, metrics)
    # Written last: the export at this step is complete (a rerun of a finished run then has nothing to do).
    (Path(cfg.output_dir) / EXPORT_RECORD).write_text(json.dumps({"step": progress.step, "metrics": metrics}, indent=2))


def finished_run(cfg: TrainConfig, progress: Progress, max_steps: int) -> Optional[str]:
    """Why a resumed run has nothing left to do (its step or wall-clock budget is used up and the pipeline of that
    step was exported), or None."""
    if progress.step >= max_steps:
        why = f"step {progress.step} of --max_train_steps {max_steps} reached"
    elif cfg.max_train_minutes and progress.train_seconds >= 60 * cfg.max_train_minutes:
        why = f"--max_train_minutes budget of {cfg.max_train_minutes:g} min spent at step {progress.step}"
    else:
        return None
    try:
        exported = json.loads((Path(cfg.output_dir) / EXPORT_RECORD).read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None
    return why if exported == progress.step else None


# ----------------------------------------------------------------------------------------------------------------
# The loop.


@dataclass
class Run:
    """Everything one optimizer step works with, built once by `setup` (also used by benchmarks/compare_methods.py
    to time each method's real step side by side)."""

    cfg: TrainConfig
    accelerator: object
    layout: Layout
    data: object
    unet: torch.nn.Module  # the bare U-Net (model is its DDP/accelerate wrapper)
    model: torch.nn.Module
    noise_scheduler: object
    tables: DiffusionTables
    sampler: object
    ema: Optional[EMA]
    phema: Optional[PowerEMAs]
    optimizer: object
    lr_scheduler: object
    max_steps: int
    progress: Progress = field(default_factory=Progress)
    stats: Stats = field(default_factory=Stats)
    hook_ctx: SimpleNamespace = field(default_factory=SimpleNamespace)


def setup(cfg: TrainConfig, log, resume_from: Optional[Path] = None, entries=None) -> Run:
    """Accelerator, data on the device, model, noise schedule, EMA, optimizer, LR schedule, timestep sampler."""
    # Set up the accelerator and load the data onto the device.
    accelerator = make_accelerator(cfg)
    cfg.mixed_precision = accelerator.mixed_precision
    is_main, rank, world = accelerator.is_main_process, accelerator.process_index, accelerator.num_processes
    device = accelerator.device
    accelerator.wait_for_everyone()  # every rank has checked its input before anything is written
    layout = Layout(cfg.train_batch_size, world, cfg.gradient_accumulation_steps)
    with accelerator.main_process_first():
        data = load_train_data(cfg, layout, rank, device, entries, log)
    out = Path(cfg.output_dir)
    if is_main:
        if cfg.overwrite_output_dir and run_holds_training(out) and resume_from is None:
            clear_run(out)
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()

    # Build the model, noise schedule, EMA, optimizer, LR schedule and timestep sampler.
    if device.type == "cuda" and cfg.allow_tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(seed_for(cfg.seed, "init"))  # identical initial weights on every rank
    unet = configure_attention(build_unet(cfg), cfg.attention_impl, device.type)
    if cfg.channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    noise_scheduler = build_noise_scheduler(cfg)
    tables = DiffusionTables.build(noise_scheduler.alphas_cumprod, cfg, device)
    sampler = build_sampler(cfg, device, tables)
    ema = None
    if cfg.use_ema:
        ema = EMA(unet, cfg.ema_max_decay, cfg.ema_min_decay, cfg.ema_warmup, cfg.ema_inv_gamma, cfg.ema_power)
        ema.model.to(device)
    optimizer = build_optimizer(cfg, unet.parameters(), sampler.parameters())
    max_steps = total_steps(cfg, data.steps_per_epoch)
    from diffusers.optimization import get_scheduler

    lr_scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.lr_warmup_steps,
                                 num_training_steps=max_steps)
    phema = PowerEMAs(unet, cfg.ema_snapshots).to(device) if cfg.ema_snapshots else None
    if cfg.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    if cfg.compile:
        unet.compile()  # in place: the parameters and state_dict keys stay those of the bare U-Net
    model, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    run = Run(cfg, accelerator, layout, data, unet, model, noise_scheduler, tables, sampler, ema, phema, optimizer,
              lr_scheduler, max_steps)
    run.hook_ctx = SimpleNamespace(accelerator=accelerator, autocast=accelerator.autocast, seed=cfg.seed, model=unet)
    TrainState(run.progress, sampler, ema, phema).register(accelerator)
    return run


def run_progress(run: Run, step: int) -> float:
    """Fraction of the run done: steps / max steps, or the spent share of --max_train_minutes if that is larger
    (then it depends on the clock, so runs with a wall-clock budget are not bit-reproducible - they never are)."""
    frac = step / max(1, run.max_steps)
    if run.cfg.max_train_minutes:
        frac = max(frac, run.progress.train_seconds / (60 * run.cfg.max_train_minutes))
    return min(1.0, frac)


def optimizer_step(run: Run, step: int, micro_batches: list[torch.Tensor]):
    """One optimizer step over this rank's micro-batches; returns (local per-sample losses [accum * B], grad norm)."""
    cfg, accelerator, layout, sampler, tables = run.cfg, run.accelerator, run.layout, run.sampler, run.tables
    device, rank, model = accelerator.device, accelerator.process_index, run.model

    # Draw this optimizer step's global timesteps, weights and noise (identical on every rank; each takes its slice).
    g = generator(device, cfg.seed, "step", step)
    sampler.begin_step(step, run_progress(run, step))
    if not sampler.conditional:
        t_all, w_all = sampler.sample(layout.global_batch, device, g)  # [G]
    noise_all = torch.randn((layout.global_batch, 3, cfg.resolution, cfg.resolution), generator=g, device=device)
    torch.manual_seed(seed_for(cfg.seed, "dropout", rank, step))  # dropout masks: (seed, rank, step)

    # Evaluate the loss and accumulate gradients over the micro-batches.
    local_losses, local_t = [], []
    for micro, x0 in enumerate(micro_batches):
        sl = layout.slice(micro, rank)
        if sampler.conditional:  # t depends on this rank's x0 (kim2025)
            t, w = sampler.sample_conditional(x0, generator(device, cfg.seed, "t", step, micro, rank))
        else:
            t, w = t_all[sl], w_all[sl]
        noise = noise_all[sl]
        sa, s1 = tables.sqrt_abar[t], tables.sqrt_one_minus_abar[t]
        with accelerator.accumulate(model):
            x_t = q_sample(x0, noise, sa, s1)  # [B, 3, S, S]
            if cfg.channels_last:
                x_t = x_t.contiguous(memory_format=torch.channels_last)
            pred = model(x_t, t).sample
            loss_b = tables.weight[t] * per_sample_mse(pred, training_target(cfg.prediction_type, x0, noise, sa, s1))
            accelerator.backward(sampler.loss(t, w, loss_b).mean())
        local_losses.append(loss_b.detach())
        local_t.append(t)
        run.stats.report_binned("loss_by_t", t * DIAGNOSTIC_BINS // cfg.ddpm_num_steps, loss_b, DIAGNOSTIC_BINS)

    # Optimizer step, LR schedule, EMA, timestep-sampler update.
    sampler.before_optimizer_step(run.hook_ctx)
    # pre-clip global norm (identical on every rank); without clipping the same call only measures it (x 1.0)
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
    run.optimizer.step()
    run.lr_scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    sampler.after_optimizer_step(run.hook_ctx)
    if run.ema is not None:
        run.ema.update(run.unet)
    if run.phema is not None:
        run.phema.update(run.unet)
    losses = torch.cat(local_losses)
    if sampler.needs_losses:
        sampler.update(*gather_for_sampler(accelerator, layout, losses, torch.cat(local_t),
                                           None if sampler.conditional else t_all), grad_norm=grad_norm)
    return losses, grad_norm


def train(cfg: TrainConfig) -> dict:
    """Train as configured; returns a summary (final step, train seconds, why it stopped)."""
    # Check the output folder and the data source before anything starts (bad input: one line, nothing touched).
    from tqdm.auto import tqdm

    launcher_rank = int(os.environ.get("RANK", "0"))

    def log(msg: str) -> None:
        if launcher_rank == 0:
            tqdm.write(msg, file=sys.stdout)
            sys.stdout.flush()

    resume_from = check_output_dir(cfg, log)
    entries = open_entries(cfg)

    # Build everything: accelerator, data, model, EMA, optimizer, LR schedule, timestep sampler.
    run = setup(cfg, log, resume_from, entries)
    accelerator, layout, data, sampler, progress = run.accelerator, run.layout, run.data, run.sampler, run.progress
    ema, phema, model, noise_scheduler, max_steps = run.ema, run.phema, run.model, run.noise_scheduler, run.max_steps
    is_main, world, device, out = accelerator.is_main_process, accelerator.num_processes, accelerator.device, Path(cfg.output_dir)

    # Resume, or start a new run.
    stats_file = JsonlWriter(out / "stats.jsonl", is_main)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        done_why = finished_run(cfg, progress, max_steps)
        if done_why:  # every rank loaded the same state, so every rank returns here (no collective is skipped)
            log(f"nothing to train: {done_why} and its pipeline is exported in {out} (raise --max_train_steps or "
                "--max_train_minutes to train on)")
            if is_main and cfg.push_to_hub:  # the upload may be what the rerun is for (unchanged files are skipped)
                uploader = make_uploader(cfg, log)
                uploader.push(out, f"final pipeline at step {progress.step}")
                uploader.close()
            return {"step": progress.step, "train_seconds": progress.train_seconds, "stopped": "finished",
                    "world_size": world}
        stats_file.truncate_after(progress.step)
        log(f"resumed from {resume_from} at step {progress.step}")
    elif is_main:
        (out / "stats.jsonl").unlink(missing_ok=True)
    num_params = count_parameters(run.unet)
    info = run_info(accelerator, cfg, layout, num_params, data)
    if is_main:
        (out / "config.json").write_text(cfg.to_json())
        (out / "run_info.json").write_text(json.dumps({**info, "sampler": sampler.describe()}, indent=2))
    uploader = make_uploader(cfg, log) if is_main and cfg.push_to_hub else None
    evaluator = None
    if cfg.eval_steps or cfg.eval_at_steps:
        from .evaluation import InTrainingEvaluator

        evaluator = InTrainingEvaluator(cfg, accelerator, data.images, log)
    accelerator.init_trackers(cfg.tracker_project_name, config=tracker_config(cfg))
    log(f"world_size={world} device={device} mixed_precision={accelerator.mixed_precision} params={num_params:,} "
        f"global_batch={layout.global_batch} (= {cfg.train_batch_size} per device x {world} processes x "
        f"{cfg.gradient_accumulation_steps} accumulation) steps={max_steps} sampler={sampler.name} "
        f"weighting={cfg.loss_weighting}")

    # Training loop.
    stats = run.stats
    sampling_unet = ema.model if ema else run.unet  # previews, evaluation and export use the EMA weights
    p_history: list[tuple[int, list[float]]] = []  # (step, p(t) in HEATMAP_BINS bins) at every log step
    control = StopControl(world, cfg.max_train_minutes * 60 if cfg.max_train_minutes else None)
    batches = data.batches(progress.step)
    interactive = sys.stdout.isatty()  # a progress bar on a terminal; one line per log step in files
    bar = tqdm(total=max_steps, initial=progress.step, disable=not (is_main and interactive), desc="train",
               unit="step", dynamic_ncols=True, file=sys.stdout)
    window_t0, window_images = progress.train_seconds, 0  # img/s over training time only
    stop_reason, last_metrics = None, None
    last_checkpoint = resume_from and progress.step
    while progress.step < max_steps:
        t_step = time.perf_counter()

        # One optimizer step: timesteps, noise, loss, backward, update, EMA, timestep-sampler update.
        losses, grad_norm = optimizer_step(run, progress.step, next(batches))
        progress.step += 1
        progress.images_seen += layout.global_batch
        window_images += layout.global_batch
        stats.report("loss", losses)
        if grad_norm is not None:
            stats.report("grad_norm", grad_norm)
        progress.train_seconds += time.perf_counter() - t_step
        bar.update(1)

        # Statistics: one collective and one host sync per log step.
        if progress.step % cfg.logging_steps == 0 or progress.step == max_steps:
            values = stats.flush(accelerator)
            values.update(sampler_diagnostics(run.sampler, p_history, progress.step))
            now = progress.train_seconds
            record = {"step": progress.step, "images": progress.images_seen, "train_seconds": round(progress.train_seconds, 3),
                      "lr": run.lr_scheduler.get_last_lr()[0], "img_per_s": window_images / max(now - window_t0, 1e-9),
                      "world_size": world, **values}
            window_t0, window_images = now, 0
            stats_file.write(record)
            accelerator.log(tracker_values(record), step=progress.step)
            bar.set_postfix(loss=f"{values.get('loss', math.nan):.4f}", img_s=f"{record['img_per_s']:.0f}",
                            lr=f"{record['lr']:.2e}", refresh=False)
            if not interactive:
                log(f"step {progress.step}/{max_steps} loss={values.get('loss', math.nan):.4f} "
                    f"img/s={record['img_per_s']:.0f} lr={record['lr']:.2e} train_time={progress.train_seconds:.0f}s")

        # Evaluate: FID / proxy FD of the EMA model, logged with the training wall-clock (its own time excluded).
        if evaluator is not None and evaluator.due(progress.step):
            metrics = evaluator(sampling_unet, noise_scheduler.config)
            if metrics:
                record = {"step": progress.step, "images": progress.images_seen,
                          "train_seconds": round(progress.train_seconds, 3), **metrics}
                stats_file.write(record)
                accelerator.log({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=progress.step)
                last_metrics = record
                log(f"eval at step {progress.step}: {evaluator.featnet.metric}={metrics[evaluator.featnet.metric]:.4f} "
                    f"({metrics['eval_images']} images, {metrics['eval_seconds']}s)")

        # Sample grid, checkpoint, stop.
        stop = control.should_stop(progress.train_seconds)
        done = stop or progress.step >= max_steps
        if cfg.save_images_steps and progress.step % cfg.save_images_steps == 0 and not done:
            preview_grid(accelerator, cfg, sampling_unet, noise_scheduler, progress.step)
            save_heatmap(accelerator, cfg, p_history)
        if phema is not None and progress.step % cfg.ema_snapshot_steps == 0 and is_main:
            phema.save_snapshots(out / "ema_snapshots")
        if (cfg.checkpointing_steps and progress.step % cfg.checkpointing_steps == 0) or done:
            t0 = time.perf_counter()
            path = save_checkpoint(accelerator, out, progress.step, cfg.to_dict(), cfg.checkpoints_total_limit)
            progress.train_seconds += time.perf_counter() - t0
            last_checkpoint = progress.step
            log(f"saved {path}")
            if uploader is not None and cfg.push_checkpoints:
                uploader.push(out, f"checkpoint at step {progress.step}")
        if cfg.save_model_steps and progress.step % cfg.save_model_steps == 0 and not done:
            export_pipeline(accelerator, cfg, sampling_unet, noise_scheduler, progress, info, last_metrics)
            if uploader is not None:
                uploader.push(out, f"pipeline at step {progress.step}")
        if stop:
            stop_reason = control.reason
            log(f"stopping after step {progress.step}: {stop_reason}; checkpoint written, rerun the same command with "
                "--resume_from_checkpoint latest to continue")
            break
    bar.close()
    control.close()

    # Final sample grid and DDPMPipeline export (skipped when preempted: the checkpoint is what matters then).
    preempted = bool(stop_reason) and not stop_reason.startswith("--max_train_minutes")
    if last_checkpoint != progress.step:
        save_checkpoint(accelerator, out, progress.step, cfg.to_dict(), cfg.checkpoints_total_limit)
    if not preempted:
        if phema is not None and is_main and progress.step % cfg.ema_snapshot_steps != 0:
            phema.save_snapshots(out / "ema_snapshots")
        grid = preview_grid(accelerator, cfg, sampling_unet, noise_scheduler, progress.step)
        save_heatmap(accelerator, cfg, p_history)
        export_pipeline(accelerator, cfg, sampling_unet, noise_scheduler, progress, {**info, "grid": grid}, last_metrics)
        if uploader is not None:
            uploader.push(out, f"final pipeline at step {progress.step}")
    if uploader is not None:
        uploader.close(timeout=30 if preempted else None)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    summary = {"step": progress.step, "train_seconds": progress.train_seconds, "stopped": stop_reason,
               "world_size": world}
    log(f"done: {json.dumps(summary)}")
    return summary
