"""The training configuration as data: one frozen dataclass in sections (each field a `fields.setting`: default,
help, section, choices, check, model_key), its JSON round trip, `replace`, and reading a saved config.json.

Every field is a flag of `train_accelerate.py` with the same name, and so is every option of every timestep method
(`timestep_options`: the chosen method's `Options`, timesteps/registry.py; flat keys in the saved config, as the
flags). The registry is imported when first needed (`_methods()`), not with this module; it reads the built-in
methods' options from their files without importing them (their files import torch, ~1 s).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import ConfigError
from ..fields import above, setting
from ..secrets import SECRET_FIELDS

# Values that are never written to disk (config.json, trackers, checkpoints, model cards).


@dataclass(frozen=True)
class TrainConfig:
    preset: str = setting("ddpm-cifar10", "named preset that fills every flag not given (see PRESETS)", section="run")
    output_dir: str = setting(
        "runs/ddpm", "run folder: config.json, stats.jsonl, checkpoint-*/, samples/, exported pipeline")
    overwrite_output_dir: bool = setting(
        False, "replace the run in output_dir (or train into a folder holding other files): its files are moved "
        "aside right before training and deleted at the new run's first checkpoint")
    seed: int = setting(0, "base seed; data order, noise, timesteps and dropout derive from (seed, rank, step)")

    dataset_name: typing.Optional[str] = setting(
        "cifar10", "'cifar10' (torchvision) or a Hub dataset id with an image column", section="data")
    dataset_config_name: typing.Optional[str] = setting(None, "Hub dataset configuration name")
    train_data_dir: typing.Optional[str] = setting(
        None, "folder or .zip of images (class subfolders allowed); wins over dataset_name")
    image_column: typing.Optional[str] = setting(
        None, "image column of a Hub dataset; None = 'image' or 'img', whichever exists")
    cache_dir: typing.Optional[str] = setting(
        None, "downloads and decoded-image caches; None = ~/.cache/adaptive-diffusion")
    resolution: int = setting(32, "training image size in pixels (square)", model_key=True)
    random_flip: bool = setting(True, "random horizontal flip, made on the device per batch")
    max_train_samples: typing.Optional[int] = setting(None, "use only the first N images (debugging, quick runs)")
    data_device: str = setting(
        "auto", "where the decoded uint8 images live: auto (the training device) or cpu", choices=("auto", "cpu"))
    max_resident_gb: float = setting(
        8.0, "datasets larger than this (uint8) stream from disk instead of being held in memory", check=above(0))
    dataloader_num_workers: int = setting(2, "decoding workers of the streaming loader (resident data needs none)")

    block_out_channels: typing.Tuple[int, ...] = setting(
        (128, 256, 256, 256), "channels per U-Net level", section="model (UNet2DModel)", model_key=True)
    layers_per_block: int = setting(2, "residual blocks per level", model_key=True)
    down_block_types: typing.Tuple[str, ...] = setting(
        ("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"), "encoder blocks", model_key=True)
    up_block_types: typing.Tuple[str, ...] = setting(
        ("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"), "decoder blocks", model_key=True)
    attention_head_dim: typing.Optional[int] = setting(
        None, "channels per attention head; None = one head per layer (DDPM)", model_key=True)
    dropout: float = setting(0.1, "dropout in the residual blocks", model_key=True)
    norm_num_groups: int = setting(32, "GroupNorm groups", model_key=True)

    ddpm_num_steps: int = setting(1000, "diffusion steps T", section="diffusion (DDPMScheduler)", model_key=True)
    ddpm_beta_schedule: str = setting(
        "linear", "linear | scaled_linear | squaredcos_cap_v2 | sigmoid",
        choices=("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"), model_key=True)
    ddpm_beta_start: float = setting(1e-4, "beta_1", model_key=True)
    ddpm_beta_end: float = setting(0.02, "beta_T", model_key=True)
    prediction_type: str = setting(
        "epsilon", "epsilon | sample | v_prediction", choices=("epsilon", "sample", "v_prediction"), model_key=True)
    ddpm_num_inference_steps: int = setting(1000, "DDPM ancestral steps for the preview grids")

    loss_weighting: str = setting(
        "none", "objective w(t): none (L_simple) | min_snr | p2",
        section="objective and timestep sampling", choices=("none", "min_snr", "p2"), model_key=True)
    snr_gamma: float = setting(5.0, "Min-SNR gamma (Hang et al. 2023)", model_key=True)
    p2_gamma: float = setting(1.0, "P2 exponent gamma (Choi et al. 2022)", model_key=True)
    p2_k: float = setting(1.0, "P2 offset k", model_key=True)
    timestep_sampler: str = setting(
        "uniform", "how t is drawn: a method of its own --help section below, or pkg.module:Class (docs/adaptive.md)",
        model_key=True)
    # the method's Options (timesteps/registry.py): its fields are flags and config keys of their own
    timestep_options: typing.Any = field(default=None, metadata={"options": True})

    train_batch_size: int = setting(128, "images per device per micro-step", section="optimisation")
    gradient_accumulation_steps: int = setting(1, "micro-steps per optimizer step")
    learning_rate: float = setting(2e-4, "peak learning rate")
    lr_scheduler: str = setting(
        "constant_with_warmup", "constant | constant_with_warmup | linear | cosine | cosine_with_restarts | "
        "polynomial",
        choices=("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"))
    lr_warmup_steps: int = setting(5000, "optimizer steps of linear warm-up (independent of process count)")
    adam_beta1: float = setting(0.9, "AdamW beta1")
    adam_beta2: float = setting(0.999, "AdamW beta2")
    adam_weight_decay: float = setting(0.0, "AdamW decoupled weight decay (0 = Adam, as in DDPM)")
    adam_epsilon: float = setting(1e-8, "AdamW epsilon")
    max_grad_norm: float = setting(1.0, "gradient clipping by global norm; 0 disables")
    max_train_steps: typing.Optional[int] = setting(800_000, "optimizer steps; None = num_epochs over the data")
    num_epochs: typing.Optional[int] = setting(None, "epochs, used when max_train_steps is None")
    max_train_minutes: typing.Optional[float] = setting(
        None, "wall-clock budget of training (evaluation excluded); stop and save when spent")
    mixed_precision: typing.Optional[str] = setting(
        None, "no | fp16 | bf16; None = the accelerate config's choice", choices=("no", "fp16", "bf16"))

    use_ema: bool = setting(
        True, "keep an exponential moving average of the weights (sampled and exported)", section="EMA", model_key=True)
    ema_max_decay: float = setting(0.9999, "decay cap")
    ema_min_decay: float = setting(0.0, "decay floor")
    ema_warmup: str = setting(
        "power", "power: 1-(1+n/inv_gamma)^-power (Diffusers EMAModel) | ratio: (1+n)/(10+n) | none",
        choices=("power", "ratio", "none"))
    ema_inv_gamma: float = setting(1.0, "inverse multiplicative factor of the power warm-up")
    ema_power: float = setting(0.75, "exponent of the power warm-up")

    allow_tf32: bool = setting(True, "TF32 matmuls/convolutions on Ampere+ GPUs", section="speed")
    channels_last: bool = setting(False, "NHWC memory format for the U-Net")
    attention_impl: str = setting(
        "auto", "attention kernel: auto (matmul on the CPU under bf16 autocast, else sdpa) | sdpa | classic | matmul "
        "(bf16 matmuls over cache-sized groups of heads)", choices=("auto", "sdpa", "classic", "matmul"))
    compile: bool = setting(
        False, "torch.compile the U-Net's training forward (compile time is reported, not counted as training)")
    gradient_checkpointing: bool = setting(
        False, "recompute U-Net block activations in the backward pass (less memory, slower)")

    logger: str = setting(
        "tensorboard", "tensorboard | wandb | none",
        section="logging, previews, checkpoints", choices=("tensorboard", "wandb", "none"))
    logging_dir: str = setting("logs", "tracker folder, relative to output_dir")
    tracker_project_name: str = setting("adaptive-diffusion", "project name given to the trackers")
    logging_steps: int = setting(50, "optimizer steps between statistics flushes (the only per-step host syncs)")
    log_timestep_bins: bool = setting(
        False, "also send the per-timestep-bin diagnostics (timesteps/...) of uniform sampling to the trackers "
        "(always for other methods; stats.jsonl has them)")
    save_images_steps: typing.Optional[int] = setting(
        10_000, "optimizer steps between EMA sample grids; None = only at the end")
    num_grid_images: int = setting(64, "images in each sample grid (fixed seeds, comparable over time)")
    checkpointing_steps: typing.Optional[int] = setting(
        5_000, "optimizer steps between resumable checkpoints; None = only at the end")
    checkpoints_total_limit: typing.Optional[int] = setting(None, "keep only the newest N complete checkpoints")
    resume_from_checkpoint: typing.Optional[str] = setting(None, "'latest' or a checkpoint folder")
    ddp_timeout_minutes: float = setting(
        10.0, "how long a rank waits in a collective for a stopped or wedged peer before failing (gloo/NCCL timeout)")

    save_model_steps: typing.Optional[int] = setting(
        None, "optimizer steps between DDPMPipeline exports to output_dir (always at the end)",
        section="export, Hub, post-hoc EMA")
    push_to_hub: bool = setting(
        False, "upload each export to the Hub in the background; token and repo are checked before the first step")
    hub_model_id: typing.Optional[str] = setting(None, "Hub repo id; None = the output_dir's folder name")
    hub_token: typing.Optional[str] = setting(
        None, "Hub token (else HF_TOKEN or the cached login); never written anywhere")
    hub_private_repo: bool = setting(False, "create the Hub repo private")
    license: typing.Optional[str] = setting(
        None, "the model's license in its card's metadata (a Hub license id: mit, apache-2.0, cc-by-4.0, ...); none = "
              "not stated")
    push_checkpoints: bool = setting(
        False, "also upload training-state checkpoint-* folders (off: only the pipeline and card)")
    hub_upload_timeout: float = setting(
        300.0, "seconds the end of a run waits for its upload; then it says what is missing and exits 3")
    ema_snapshots: typing.Tuple[float, ...] = setting(
        (), "sigma_rel of power-function EMAs kept for post-hoc EMA (EDM2: 0.05 0.10)")
    ema_snapshot_steps: int = setting(
        5000, "optimizer steps between post-hoc EMA snapshots (output_dir/ema_snapshots/)")

    eval_steps: typing.Optional[int] = setting(
        None, "optimizer steps between evaluations; None = only at eval_at_steps",
        section="evaluation during training (time excluded from the training budget)")
    eval_at_steps: typing.Tuple[int, ...] = setting(
        (), "explicit evaluation points in optimizer steps (e.g. the benchmark's)")
    eval_num_images: int = setting(10_000, "generated images per evaluation")
    eval_inference_steps: int = setting(100, "DDPM ancestral sampling steps per image (respaced when < ddpm_num_steps)")
    eval_batch_size: int = setting(256, "sampling batch per device")
    eval_seed_offset: int = setting(
        1_000_000, "image i of every evaluation is generated from seed eval_seed_offset + i")
    eval_feature_extractor: str = setting("inception", "'inception' (clean-fid, FID) or a TorchScript .pt (proxy FD)")
    eval_mode: str = setting(
        "clean", "clean-fid mode for Inception: clean | legacy_tensorflow | legacy_pytorch",
        choices=("clean", "legacy_tensorflow", "legacy_pytorch"))
    eval_ref_stats: typing.Optional[str] = setting(
        None, ".npz with mu and sigma; None = CIFAR-10 train stats or built from eval_ref_dir")
    eval_ref_dir: typing.Optional[str] = setting(None, "folder/.zip of reference images; None = the training data")
    eval_ref_num_images: int = setting(
        10_000, "reference images: a fixed random subset (seed 0) at the training resolution")

    def __post_init__(self):
        """`timestep_options`: None (the method's defaults), a dict of them or another method's options (their
        shared fields) become the method's `Options`."""
        opts = self.timestep_options
        try:
            method = _methods().declaration(self.timestep_sampler)
        except ConfigError:
            if not _methods().EXTERNAL.match(self.timestep_sampler):
                raise
            # a user's method that does not import here (sampling a run trained with it needs no method): its
            # options stay a dict, and validate() - which every training run passes - reports the import error
            object.__setattr__(self, "timestep_options", types.MappingProxyType(dict(opts or {})))
            return
        if not isinstance(opts, method.Options):
            values = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) else dict(opts or {})
            object.__setattr__(self, "timestep_options", _methods().options_from(method, values))

    @property
    def method(self) -> type:
        """The class of the configured timestep method (a timesteps.base.TimestepSampler; its file is imported)."""
        return _methods().method(self.timestep_sampler)

    def to_dict(self, include_secrets: bool = False) -> dict:
        """Plain JSON-ready dict, the method's options as keys of their own; secrets are dropped unless asked for."""
        out = {}
        for f in fields(self):
            if f.name in SECRET_FIELDS and not include_secrets:
                continue
            if f.metadata.get("options"):
                opts = self.timestep_options
                values = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) else dict(opts)
                out.update({k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True) -> "TrainConfig":
        """From `to_dict`'s form (older configs, which kept every method's options, too); `strict`: unknown keys
        are an error, else dropped."""
        d = current_keys(d)
        spec = d.get("timestep_sampler", cls.timestep_sampler)
        try:
            options = set(_methods().option_names(_methods().declaration(spec)))
        except ConfigError:
            if not _methods().EXTERNAL.match(spec):
                raise
            options = set(d) - set(config_fields())  # a user's method that does not import here: see __post_init__
        unknown = sorted(set(d) - set(config_fields()) - options)
        if unknown and strict:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in config_fields()}
        return cls(**kwargs, timestep_options={k: v for k, v in d.items() if k in options})


def _methods():
    """adaptive.timesteps.registry, imported on first use: it reads the method files (no torch; importing them does
    not happen here, see registry.py)."""
    from ..timesteps import registry  # the registry sits above the config (it reads methods that read the config)

    return registry


def config_fields() -> dict[str, dataclasses.Field]:
    """The fields of TrainConfig that are flags and keys of their own (all but `timestep_options`)."""
    return {f.name: f for f in fields(TrainConfig) if not f.metadata.get("options")}


def current_keys(saved: dict) -> dict:
    """A saved config without the options of the methods it did not use (configs written before the methods owned
    their options kept every method's)."""
    chosen = saved.get("timestep_sampler", TrainConfig.timestep_sampler)
    return {k: v for k, v in saved.items()
            if (owner := _methods().owner_of(k)) is None or owner.name == chosen or k in config_fields()}


MODEL_KEYS = tuple(f.name for f in fields(TrainConfig) if f.metadata.get("model_key"))


def replace(cfg: TrainConfig, **changes) -> TrainConfig:
    """`cfg` with some fields or method options changed (options of the method the result has)."""
    own = {k: v for k, v in changes.items() if k in config_fields() or k == "timestep_options"}
    options = {k: v for k, v in changes.items() if k not in own}
    out = dataclasses.replace(cfg, **own)
    if options:
        out = dataclasses.replace(out, timestep_options=dataclasses.replace(out.timestep_options, **options))
    return out


def read_config(path: Path) -> dict:
    """A saved config file: a JSON object, else a one-line ConfigError naming the file and the problem."""
    try:
        text = path.read_text()
        saved = json.loads(text)
    except (OSError, ValueError) as e:
        why = "empty" if isinstance(e, ValueError) and not text.strip() else f"{type(e).__name__}: {e}"
        raise ConfigError(f"cannot read the config {path} ({why})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"the config {path} is not a JSON object (got {type(saved).__name__})")
    return saved


def load_run_config(run_dir: str) -> TrainConfig:
    """The saved config of a training run (or checkpoint) folder; a one-line ConfigError when it has none."""
    path = Path(run_dir).expanduser() / "config.json"
    if not path.is_file():
        raise ConfigError(f"--like_run {run_dir} has no config.json (not a training run or checkpoint folder)")
    saved = read_config(path)
    try:
        return TrainConfig.from_dict(saved)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"the run config {path} does not hold a training config ({type(e).__name__}: {e})") from None
