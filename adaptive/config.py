"""Training configuration: one frozen dataclass in sections, named presets as plain dicts, JSON round trip.

Every field is a command-line flag of `train_accelerate.py` with the same name. Flags default to None; the
preset fills what was not given, the dataclass default fills the rest (edm2 style). The resolved config is
validated once (`validate`), written to `output_dir/config.json` and into every checkpoint, and never mutated (a
changed value is a new config: `replace`). Each field's `# comment` is its help text; the `# --- section ---` line
above it is its section; fields declared with `model_key(...)` change the model or the objective, so a checkpoint
that differs in one of them is refused on resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

# Values that are never written to disk (config.json, trackers, checkpoints, model cards).
SECRET_FIELDS = ("hub_token",)


class ConfigError(ValueError):
    """A user-facing problem (bad input, or a fault of the run in adaptive/faults.py): one line on stderr and
    `exit_code`, never a traceback."""

    exit_code = 2


def model_key(default):
    """A field that defines the model or the objective: resuming a checkpoint that differs in it is refused."""
    return field(default=default, metadata={"model_key": True})


@dataclass(frozen=True)
class TrainConfig:
    # --- run ---
    preset: str = "ddpm-cifar10"  # named preset that fills every flag not given (see PRESETS)
    output_dir: str = "runs/ddpm"  # run folder: config.json, stats.jsonl, checkpoint-*/, samples/, exported pipeline
    overwrite_output_dir: bool = False  # replace the run in output_dir (or train into a folder holding other files): its files are moved aside right before training and deleted at the new run's first checkpoint
    seed: int = 0  # base seed; data order, noise, timesteps and dropout derive from (seed, rank, step)

    # --- data ---
    dataset_name: typing.Optional[str] = "cifar10"  # 'cifar10' (torchvision) or a Hub dataset id with an image column
    dataset_config_name: typing.Optional[str] = None  # Hub dataset configuration name
    train_data_dir: typing.Optional[str] = None  # folder or .zip of images (class subfolders allowed); wins over dataset_name
    image_column: typing.Optional[str] = None  # image column of a Hub dataset; None = 'image' or 'img', whichever exists
    cache_dir: typing.Optional[str] = None  # downloads and decoded-image caches; None = ~/.cache/adaptive-diffusion
    resolution: int = model_key(32)  # training image size in pixels (square)
    random_flip: bool = True  # random horizontal flip, made on the device per batch
    max_train_samples: typing.Optional[int] = None  # use only the first N images (debugging, quick runs)
    data_device: str = "auto"  # where the decoded uint8 images live: auto (the training device) or cpu
    max_resident_gb: float = 8.0  # datasets larger than this (uint8) stream from disk instead of being held in memory
    dataloader_num_workers: int = 2  # decoding workers of the streaming loader (resident data needs none)

    # --- model (UNet2DModel) ---
    block_out_channels: typing.Tuple[int, ...] = model_key((128, 256, 256, 256))  # channels per U-Net level
    layers_per_block: int = model_key(2)  # residual blocks per level
    down_block_types: typing.Tuple[str, ...] = model_key(("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"))  # encoder blocks
    up_block_types: typing.Tuple[str, ...] = model_key(("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))  # decoder blocks
    attention_head_dim: typing.Optional[int] = model_key(None)  # channels per attention head; None = one head per layer (DDPM)
    dropout: float = model_key(0.1)  # dropout in the residual blocks
    norm_num_groups: int = model_key(32)  # GroupNorm groups

    # --- diffusion (DDPMScheduler) ---
    ddpm_num_steps: int = model_key(1000)  # diffusion steps T
    ddpm_beta_schedule: str = model_key("linear")  # linear | scaled_linear | squaredcos_cap_v2 | sigmoid
    ddpm_beta_start: float = model_key(1e-4)  # beta_1
    ddpm_beta_end: float = model_key(0.02)  # beta_T
    prediction_type: str = model_key("epsilon")  # epsilon | sample | v_prediction
    ddpm_num_inference_steps: int = 1000  # DDPM ancestral steps for the preview grids

    # --- objective and timestep sampling ---
    loss_weighting: str = model_key("none")  # objective w(t): none (L_simple) | min_snr | p2
    snr_gamma: float = model_key(5.0)  # Min-SNR gamma (Hang et al. 2023)
    p2_gamma: float = model_key(1.0)  # P2 exponent gamma (Choi et al. 2022)
    p2_k: float = model_key(1.0)  # P2 offset k
    timestep_sampler: str = model_key("uniform")  # how t is drawn: uniform | iddpm | speed | edm2_uncertainty | kim2025 | adaptive
    uncertainty_lr: float = 1e-2  # Adam learning rate of edm2_uncertainty's log-variances u_t
    speed_k: float = 5.0  # SpeeD: sampling weight of t < tau relative to t >= tau
    speed_lambda: float = 0.6  # SpeeD: change-aware weighting strength lambda
    adaptive_balance: float = 0.5  # adaptive: objective weight E[L_t]^-beta at the start (0 = configured, 0.5 = gradient-balanced, 1 = loss-balanced)
    adaptive_balance_final: typing.Optional[float] = 0.0  # adaptive: beta at the end of the anneal (linear in progress); None = constant
    adaptive_anneal_fraction: float = 1.0  # adaptive: share of the run over which beta goes to its final value (then stays)
    adaptive_weight_floor: float = 0.0  # adaptive: lambda >= this x the configured objective's weight (0 = no floor)
    adaptive_bins: int = 100  # adaptive: timestep bins of the running loss statistics
    adaptive_uniform_mix: float = 0.1  # adaptive: uniform floor of the proposal
    adaptive_ema: float = 0.05  # adaptive: statistics update rate per sample of a bin
    adaptive_warmup_steps: int = 20  # adaptive: uniform draws and configured objective for the first N steps
    adaptive_stratified: bool = True  # adaptive: stratified (low-discrepancy) draws over the global batch
    adaptive_normalize: str = "unit"  # adaptive: unit = expected weighted loss 1 (stationary gradient scale) | mean
    adaptive_proposal: str = "loss"  # adaptive: p ~ lambda x loss RMS (loss) | x sqrt(mean loss) (grad) | uniform
    adaptive_proposal_power: float = 1.0  # adaptive: exponent gamma on the proposal's per-bin statistic (p ~ lambda x stat^gamma; 1 = as named, 0 = lambda alone)
    adaptive_loss_scale: typing.Optional[float] = None  # adaptive: fixed loss scale s (ablations); None = the clip-anchored rule s = max_grad_norm / peak smoothed gradient norm per unit scale

    # --- optimisation ---
    train_batch_size: int = 128  # images per device per micro-step
    gradient_accumulation_steps: int = 1  # micro-steps per optimizer step
    learning_rate: float = 2e-4  # peak learning rate
    lr_scheduler: str = "constant_with_warmup"  # constant | constant_with_warmup | linear | cosine | cosine_with_restarts | polynomial
    lr_warmup_steps: int = 5000  # optimizer steps of linear warm-up (independent of process count)
    adam_beta1: float = 0.9  # AdamW beta1
    adam_beta2: float = 0.999  # AdamW beta2
    adam_weight_decay: float = 0.0  # AdamW decoupled weight decay (0 = Adam, as in DDPM)
    adam_epsilon: float = 1e-8  # AdamW epsilon
    max_grad_norm: float = 1.0  # gradient clipping by global norm; 0 disables
    max_train_steps: typing.Optional[int] = 800_000  # optimizer steps; None = num_epochs over the data
    num_epochs: typing.Optional[int] = None  # epochs, used when max_train_steps is None
    max_train_minutes: typing.Optional[float] = None  # wall-clock budget of training (evaluation excluded); stop and save when spent
    mixed_precision: typing.Optional[str] = None  # no | fp16 | bf16; None = the accelerate config's choice

    # --- EMA ---
    use_ema: bool = model_key(True)  # keep an exponential moving average of the weights (sampled and exported)
    ema_max_decay: float = 0.9999  # decay cap
    ema_min_decay: float = 0.0  # decay floor
    ema_warmup: str = "power"  # power: 1-(1+n/inv_gamma)^-power (Diffusers EMAModel) | ratio: (1+n)/(10+n) | none
    ema_inv_gamma: float = 1.0  # inverse multiplicative factor of the power warm-up
    ema_power: float = 0.75  # exponent of the power warm-up

    # --- speed ---
    allow_tf32: bool = True  # TF32 matmuls/convolutions on Ampere+ GPUs
    channels_last: bool = False  # NHWC memory format for the U-Net
    attention_impl: str = "auto"  # attention kernel: auto (matmul on the CPU under bf16 autocast, else sdpa) | sdpa | classic | matmul (bf16 matmuls over cache-sized groups of heads)
    compile: bool = False  # torch.compile the U-Net's training forward (compile time is reported, not counted as training)
    gradient_checkpointing: bool = False  # recompute U-Net block activations in the backward pass (less memory, slower)

    # --- logging, previews, checkpoints ---
    logger: str = "tensorboard"  # tensorboard | wandb | none
    logging_dir: str = "logs"  # tracker folder, relative to output_dir
    tracker_project_name: str = "adaptive-diffusion"  # project name given to the trackers
    logging_steps: int = 50  # optimizer steps between statistics flushes (the only per-step host syncs)
    log_timestep_bins: bool = False  # also send the per-timestep-bin diagnostics (timesteps/...) of uniform sampling to the trackers (always for other methods; stats.jsonl has them)
    save_images_steps: typing.Optional[int] = 10_000  # optimizer steps between EMA sample grids; None = only at the end
    num_grid_images: int = 64  # images in each sample grid (fixed seeds, comparable over time)
    checkpointing_steps: typing.Optional[int] = 5_000  # optimizer steps between resumable checkpoints; None = only at the end
    checkpoints_total_limit: typing.Optional[int] = None  # keep only the newest N complete checkpoints
    resume_from_checkpoint: typing.Optional[str] = None  # 'latest' or a checkpoint folder
    ddp_timeout_minutes: float = 10.0  # how long a rank waits in a collective for a stopped or wedged peer before failing (gloo/NCCL timeout)

    # --- export, Hub, post-hoc EMA ---
    save_model_steps: typing.Optional[int] = None  # optimizer steps between DDPMPipeline exports to output_dir (always at the end)
    push_to_hub: bool = False  # upload each export to the Hub in the background; token and repo are checked before the first step
    hub_model_id: typing.Optional[str] = None  # Hub repo id; None = the output_dir's folder name
    hub_token: typing.Optional[str] = None  # Hub token (else HF_TOKEN or the cached login); never written anywhere
    hub_private_repo: bool = False  # create the Hub repo private
    push_checkpoints: bool = False  # also upload training-state checkpoint-* folders (off: only the pipeline and card)
    hub_upload_timeout: float = 300.0  # seconds the end of a run waits for its upload; then it says what is missing and exits 3
    ema_snapshots: typing.Tuple[float, ...] = ()  # sigma_rel of power-function EMAs kept for post-hoc EMA (EDM2: 0.05 0.10)
    ema_snapshot_steps: int = 5000  # optimizer steps between post-hoc EMA snapshots (output_dir/ema_snapshots/)

    # --- evaluation during training (time excluded from the training budget) ---
    eval_steps: typing.Optional[int] = None  # optimizer steps between evaluations; None = only at eval_at_steps
    eval_at_steps: typing.Tuple[int, ...] = ()  # explicit evaluation points in optimizer steps (e.g. the benchmark's)
    eval_num_images: int = 10_000  # generated images per evaluation
    eval_inference_steps: int = 100  # DDPM ancestral sampling steps per image (respaced when < ddpm_num_steps)
    eval_batch_size: int = 256  # sampling batch per device
    eval_seed_offset: int = 1_000_000  # image i of every evaluation is generated from seed eval_seed_offset + i
    eval_feature_extractor: str = "inception"  # 'inception' (clean-fid, FID) or a TorchScript .pt (proxy FD)
    eval_mode: str = "clean"  # clean-fid mode for Inception: clean | legacy_tensorflow | legacy_pytorch
    eval_ref_stats: typing.Optional[str] = None  # .npz with mu and sigma; None = CIFAR-10 train stats or built from eval_ref_dir
    eval_ref_dir: typing.Optional[str] = None  # folder/.zip of reference images; None = the training data
    eval_ref_num_images: int = 10_000  # reference images: a fixed random subset (seed 0) at the training resolution

    def to_dict(self, include_secrets: bool = False) -> dict:
        """Plain JSON-ready dict; secrets are dropped unless asked for."""
        out = {}
        for f in fields(self):
            if f.name in SECRET_FIELDS and not include_secrets:
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        kwargs = {}
        for k, v in d.items():
            kwargs[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kwargs)


# Presets are plain dicts of the fields they set; everything else keeps the dataclass default.
_TINY_MODEL = dict(
    block_out_channels=(32, 64, 64),
    layers_per_block=1,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=8,  # UNet2DModel's default, as the benchmark protocol's model
    dropout=0.0,
)
_TINY_TRAINING = dict(
    learning_rate=2e-3,
    lr_scheduler="constant_with_warmup",
    lr_warmup_steps=200,
    adam_weight_decay=0.0,
    max_grad_norm=1.0,
    train_batch_size=128,
    mixed_precision="bf16",
    ema_max_decay=0.995,
    ema_warmup="ratio",
    max_train_steps=2000,
    ddpm_num_inference_steps=50,
    save_images_steps=500,
    num_grid_images=64,
    checkpointing_steps=500,
    logging_steps=25,
    eval_num_images=1000,
    eval_inference_steps=50,
    eval_ref_num_images=10_000,
)

PRESETS: dict[str, dict] = {
    # Ho et al. 2020, CIFAR-10: 35.7M U-Net, 800k steps of batch 128 (per device here), FID 3.17.
    "ddpm-cifar10": dict(
        resolution=32,
        block_out_channels=(128, 256, 256, 256),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=None,
        dropout=0.1,
        learning_rate=2e-4,
        lr_warmup_steps=5000,
        train_batch_size=128,
        max_train_steps=800_000,
        ema_max_decay=0.9999,
        ema_warmup="power",
    ),
    # ~1.1M-parameter U-Net at 32 px, for CPU work.
    "cpu-tiny": dict(resolution=32, **_TINY_MODEL, **_TINY_TRAINING),
    # Exactly the model and training settings of shared/benchmark/PROTOCOL.md (16 px CIFAR-10).
    "cpu-tiny16": dict(resolution=16, **_TINY_MODEL, **_TINY_TRAINING),
}

# Closed sets of values, checked by the parser (one-line error on anything else).
CHOICES: dict[str, tuple] = {
    "preset": tuple(PRESETS),
    "data_device": ("auto", "cpu"),
    "ddpm_beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"),
    "prediction_type": ("epsilon", "sample", "v_prediction"),
    "loss_weighting": ("none", "min_snr", "p2"),
    "timestep_sampler": ("uniform", "iddpm", "speed", "edm2_uncertainty", "kim2025", "adaptive"),
    "lr_scheduler": ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"),
    "mixed_precision": ("no", "fp16", "bf16"),
    "ema_warmup": ("power", "ratio", "none"),
    "logger": ("tensorboard", "wandb", "none"),
    "eval_mode": ("clean", "legacy_tensorflow", "legacy_pytorch"),
    "attention_impl": ("auto", "sdpa", "classic", "matmul"),
    "adaptive_normalize": ("unit", "mean"),
    "adaptive_proposal": ("loss", "grad", "uniform"),
}


def field_comments(cls=TrainConfig) -> dict[str, str]:
    """The `# comment` of every dataclass field: the help text of its flag."""
    out = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^#]+?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def field_sections(cls=TrainConfig) -> dict[str, str]:
    """The section of every dataclass field: the `# --- name ---` line above it."""
    out, section = {}, "run"
    for line in inspect.getsource(cls).splitlines():
        head = re.match(r"\s+# --- (.+) ---", line)
        if head:
            section = head.group(1)
        m = re.match(r"\s+(\w+): ", line)
        if m and m.group(1) in cls.__dataclass_fields__:
            out[m.group(1)] = section
    return out


MODEL_KEYS = tuple(f.name for f in fields(TrainConfig) if f.metadata.get("model_key"))


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line on stderr and exits with status 2. Flags must be spelled out:
    no abbreviations (`--hub_t` is not `--hub_token`), so a flag is always recognisable by its name."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # what error() scrubs secrets from
        return super().parse_known_args(args, namespace)

    def error(self, message):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {scrub_secrets(message, getattr(self, '_argv', []))}\n")


_SECRET_WORDS = ("tok", "secret", "passw", "apikey", "api_key", "auth")
_HF_TOKEN = re.compile(r"(?<![\w-])hf_[\w-]*")


def looks_secret(flag: str) -> bool:
    """A flag (however misspelled or abbreviated) that may carry a secret: --hub_token, --hub_t, --hubtoken, --api-key."""
    name = flag.lstrip("-").lower().replace("-", "_")
    return any(w in name for w in _SECRET_WORDS) or any(len(name) >= 3 and f.startswith(name) for f in SECRET_FIELDS)


def scrub_secrets(message: str, argv) -> str:
    """`message` (an argparse error, which may echo arguments) with the values of secret-looking flags, any value
    beginning `hf_` and $HF_TOKEN replaced by ***."""
    values = {os.environ.get("HF_TOKEN", "").strip()}
    argv = list(argv)
    for i, a in enumerate(argv):
        if a.startswith("-"):
            flag, eq, value = a.partition("=")
            if looks_secret(flag):
                values.add(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
    for v in sorted((v for v in values if v), key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(v)}(?![\w-])", "***", message)
    return _HF_TOKEN.sub("***", message)


def _base_type(tp):
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return _base_type([a for a in args if a is not type(None)][0])[0], True
    return tp, False


class _ExplicitNone:
    """Marks a flag given as 'none' (distinct from a flag not given, which the preset fills)."""

    def __repr__(self):
        return "None"


EXPLICIT_NONE = _ExplicitNone()


def _optional(conv):
    def parse(s: str):
        return EXPLICIT_NONE if s.lower() in ("none", "null") else conv(s)

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def _fmt_default(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def help_text(name: str, comment: str, cls=TrainConfig) -> str:
    """The field's comment, its default (none shown for an empty list) and the presets that set it otherwise."""
    default = cls.__dataclass_fields__[name].default
    by_preset = {p: v[name] for p, v in PRESETS.items() if name in v and v[name] != default}
    shown = ([] if default == () else [f"default {_fmt_default(default)}"])
    shown += [f"{p}: {_fmt_default(v)}" for p, v in by_preset.items()]
    return (f"{comment} [{'; '.join(shown)}]" if shown else comment).replace("%", "%%")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each flag's default as `[default X]`, unless its help says it already or there is none to show
    (None, False, an empty list)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if ("[default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or (isinstance(default, (list, tuple)) and not default)):
            return text
        return f"{text} [default {_fmt_default(default).replace('%', '%%')}]"


def add_config_arguments(parser: argparse.ArgumentParser, cls=TrainConfig) -> None:
    """One flag per dataclass field, grouped by section, default None so that presets can fill the gaps."""
    helps, sections = field_comments(cls), field_sections(cls)
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(cls):
        group = groups.setdefault(sections[f.name], parser.add_argument_group(sections[f.name]))
        tp, optional = _base_type(hints[f.name])
        kw: dict = dict(default=None, help=help_text(f.name, helps.get(f.name, ""), cls))
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is tuple:
            elem = typing.get_args(tp)[0]
            kw["type"] = lambda s, elem=elem: [elem(x) for x in s.split(",") if x]
            kw["nargs"] = "+"
            kw["metavar"] = elem.__name__.upper()
        else:
            kw["type"] = _optional(tp) if optional else tp
            if f.name in CHOICES:
                kw["choices"] = list(CHOICES[f.name]) + ([EXPLICIT_NONE] if optional else [])
                kw["metavar"] = "{" + ",".join(CHOICES[f.name]) + "}"
        group.add_argument(f"--{f.name}", **kw)


# Keys of a saved config that are never taken over: they say what this invocation should do to the folder.
NOT_INHERITED = ("overwrite_output_dir", "resume_from_checkpoint")


def resolve_config(args: argparse.Namespace, cls=TrainConfig, saved: typing.Optional[dict] = None) -> TrainConfig:
    """Dataclass defaults <- preset <- a saved config (a run's config.json or --config file) <- flags that were given."""
    saved = {k: v for k, v in (saved or {}).items() if k not in NOT_INHERITED and k not in SECRET_FIELDS}
    unknown = sorted(set(saved) - set(cls.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"the saved config has unknown keys: {', '.join(unknown)}")
    preset_name = getattr(args, "preset", None) or saved.get("preset") or cls.preset
    if preset_name not in PRESETS:
        raise ConfigError(f"unknown preset {preset_name!r} (choose from {', '.join(PRESETS)})")
    values = {**PRESETS[preset_name], **{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()},
              "preset": preset_name}
    for f in fields(cls):
        v = getattr(args, f.name, None)
        if v is None:
            continue
        if v is EXPLICIT_NONE:
            values[f.name] = None
            continue
        if typing.get_origin(_base_type(typing.get_type_hints(cls)[f.name])[0]) is tuple:
            v = tuple(x for part in v for x in (part if isinstance(part, list) else [part]))
        values[f.name] = v
    cfg = cls(**{k: v for k, v in values.items() if k in {f.name for f in fields(cls)}})
    validate(cfg)
    return cfg


def check_bins(bins: int, num_timesteps: int) -> None:
    """The adaptive method's timestep bins must split the T timesteps evenly."""
    if bins < 1 or num_timesteps % bins:
        raise ConfigError(f"--adaptive_bins {bins} must divide --ddpm_num_steps {num_timesteps}")


def validate(cfg: TrainConfig) -> None:
    """Raises ConfigError naming the first invalid value."""
    if not cfg.output_dir.strip():
        raise ConfigError("--output_dir must name a folder (an empty value would train into the current directory)")
    for f in fields(cfg):  # nan / inf are never meaningful (nan also slips through every range check below)
        v = getattr(cfg, f.name)
        if any(isinstance(x, float) and not math.isfinite(x) for x in (v if isinstance(v, tuple) else (v,))):
            raise ConfigError(f"--{f.name} must be a finite number (got {v})")
    for name, allowed in CHOICES.items():
        v = getattr(cfg, name, None)
        if v is not None and v not in allowed:
            raise ConfigError(f"--{name} {v!r} is not one of {', '.join(map(str, allowed))}")
    _check_counts(cfg)
    _check_run(cfg)
    _check_model_and_method(cfg)


def _check_counts(cfg: TrainConfig) -> None:
    """Counts and step numbers: positive, or none where none means off."""
    positive = ["resolution", "train_batch_size", "gradient_accumulation_steps", "ddpm_num_steps",
                "ddpm_num_inference_steps", "layers_per_block", "logging_steps", "num_grid_images",
                "eval_num_images", "eval_inference_steps", "eval_batch_size", "eval_ref_num_images", "norm_num_groups"]
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name} must be >= 1 (got {getattr(cfg, name)})")
    for name in ["max_train_steps", "num_epochs", "save_images_steps", "checkpointing_steps",
                 "checkpoints_total_limit", "max_train_samples", "eval_steps", "save_model_steps"]:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name} must be >= 1 or none (got {v})")
    for name in ["lr_warmup_steps", "adaptive_warmup_steps", "dataloader_num_workers"]:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name} must be >= 0 (got {getattr(cfg, name)})")
    if cfg.attention_head_dim is not None and cfg.attention_head_dim < 1:
        raise ConfigError(f"--attention_head_dim must be >= 1 or none (got {cfg.attention_head_dim})")


def _check_run(cfg: TrainConfig) -> None:
    """Run length, optimizer and process settings."""
    if cfg.max_train_steps is None and cfg.num_epochs is None:
        raise ConfigError("give --max_train_steps or --num_epochs")
    if cfg.max_train_minutes is not None and cfg.max_train_minutes <= 0:
        raise ConfigError(f"--max_train_minutes must be > 0 (got {cfg.max_train_minutes})")
    if not cfg.hub_upload_timeout > 0:
        raise ConfigError(f"--hub_upload_timeout must be > 0 seconds (got {cfg.hub_upload_timeout})")
    if cfg.max_grad_norm < 0:
        raise ConfigError(f"--max_grad_norm must be >= 0 (got {cfg.max_grad_norm})")
    if cfg.learning_rate <= 0:
        raise ConfigError(f"--learning_rate must be > 0 (got {cfg.learning_rate})")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"--{name} must be in [0, 1) (got {getattr(cfg, name)})")
    if cfg.adam_epsilon < 0 or cfg.adam_weight_decay < 0:
        raise ConfigError("--adam_epsilon and --adam_weight_decay must be >= 0")
    if cfg.ddp_timeout_minutes <= 0:
        raise ConfigError(f"--ddp_timeout_minutes must be > 0 (got {cfg.ddp_timeout_minutes})")


def _check_model_and_method(cfg: TrainConfig) -> None:
    """Model shape, noise schedule, EMA, timestep method and evaluation settings."""
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1) (got {cfg.dropout})")
    if not 0.0 <= cfg.ema_min_decay <= cfg.ema_max_decay < 1.0:
        raise ConfigError("EMA decays must satisfy 0 <= --ema_min_decay <= --ema_max_decay < 1")
    if len(cfg.down_block_types) != len(cfg.block_out_channels) or len(cfg.up_block_types) != len(cfg.block_out_channels):
        raise ConfigError("--down_block_types, --up_block_types and --block_out_channels must have the same length")
    if cfg.resolution % (2 ** (len(cfg.block_out_channels) - 1)) != 0:
        raise ConfigError(f"--resolution {cfg.resolution} must be divisible by 2^(levels-1) = {2 ** (len(cfg.block_out_channels) - 1)}")
    if any(c % cfg.norm_num_groups for c in cfg.block_out_channels):
        raise ConfigError(f"every --block_out_channels value must be divisible by --norm_num_groups {cfg.norm_num_groups}")
    if not 0.0 < cfg.ddpm_beta_start < cfg.ddpm_beta_end < 1.0:
        raise ConfigError("betas must satisfy 0 < --ddpm_beta_start < --ddpm_beta_end < 1")
    if cfg.ema_snapshot_steps < 1:
        raise ConfigError("--ema_snapshot_steps must be >= 1")
    if any(not 0.0 < s < 0.289 for s in cfg.ema_snapshots):
        raise ConfigError("--ema_snapshots values are sigma_rel in (0, 0.289) (EDM2 uses 0.05 0.10)")
    if cfg.adaptive_loss_scale is not None and not cfg.adaptive_loss_scale > 0:
        raise ConfigError("--adaptive_loss_scale must be > 0")
    check_bins(cfg.adaptive_bins, cfg.ddpm_num_steps)
    if cfg.adaptive_weight_floor < 0:
        raise ConfigError("--adaptive_weight_floor must be >= 0")
    if not 0.0 <= cfg.adaptive_proposal_power <= 4.0:
        raise ConfigError(f"--adaptive_proposal_power must be in [0, 4] (got {cfg.adaptive_proposal_power})")
    if not 0.0 < cfg.adaptive_anneal_fraction <= 1.0:
        raise ConfigError("--adaptive_anneal_fraction must be in (0, 1]")
    if any(s < 1 for s in cfg.eval_at_steps):
        raise ConfigError("--eval_at_steps must be positive step numbers")
    if cfg.eval_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--eval_inference_steps cannot exceed --ddpm_num_steps")
    if cfg.ddpm_num_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--ddpm_num_inference_steps cannot exceed --ddpm_num_steps")


def replace(cfg: TrainConfig, **changes) -> TrainConfig:
    return dataclasses.replace(cfg, **changes)


# Re-scoring a run as it was scored (`sample.py` / `evaluate_fid.py --like_run RUN`): a CLI's table maps its flags to
# (default, the run config's field); a flag not given takes the run's value, else its default.


def load_run_config(run_dir: str) -> TrainConfig:
    """The saved config of a training run (or checkpoint) folder; a one-line ConfigError when it has none."""
    path = Path(run_dir).expanduser() / "config.json"
    if not path.is_file():
        raise ConfigError(f"--like_run {run_dir} has no config.json (not a training run or checkpoint folder)")
    try:
        return TrainConfig.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the run config {path} ({type(e).__name__}: {e})") from None


def like_run_help(text: str, flag: str, table: dict) -> str:
    """`text [default X; --like_run: the run's FIELD]` for a flag of `table`."""
    default, field = table[flag]
    return f"{text} [default {_fmt_default(default)}; --like_run: the run's {field}]".replace("%", "%%")


def fill_like_run(args: argparse.Namespace, table: dict, run: typing.Optional[TrainConfig]) -> argparse.Namespace:
    """`args` with every flag of `table` that was not given (None) set to the run's field, or without a run to its
    default."""
    values = {flag: getattr(run, field) if run is not None else default for flag, (default, field) in table.items()
              if getattr(args, flag) is None}
    return argparse.Namespace(**{**vars(args), **values})


def precision_override(cfg: TrainConfig, given: typing.Optional[str], saved: dict,
                       launcher: typing.Optional[str]) -> typing.Optional[str]:
    """The start-up line when the config's mixed_precision - from the preset or the resumed run, not a flag (`given`) -
    overrides the accelerate config's (`launcher`: $ACCELERATE_MIXED_PRECISION, which accelerate launch sets); None
    when it does not."""
    if given is not None or cfg.mixed_precision is None or launcher in (None, cfg.mixed_precision):
        return None
    source = "the run's saved config" if saved.get("mixed_precision") is not None else f"preset {cfg.preset}"
    return (f"mixed_precision {cfg.mixed_precision} (from {source}) overrides the accelerate config's {launcher}; "
            f"pass --mixed_precision {launcher} to use that")
