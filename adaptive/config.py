"""Training configuration: one frozen dataclass in sections, named presets as plain dicts, JSON round trip.

Every field is a command-line flag of `train_accelerate.py` with the same name, and so is every option of every
timestep method (`timestep_options`: the chosen method's `Options`, timesteps/registry.py; flat keys in the saved
config, as the flags). Flags default to None; the preset fills what was not given, the dataclass default fills the
rest (edm2 style). The resolved config is validated once (`validate`), written to `output_dir/config.json` and into
every checkpoint, and never mutated (a changed value is a new config: `replace`). Each field is a
`fields.setting(default, help, section=, choices=, check=, model_key=)`: its help text, its `--help` section, its
closed set of values, its check; a `model_key` field changes the model or the objective, so a checkpoint that differs
in one of them is refused on resume.

The timestep methods are imported when first needed (`_methods()`), not with this module: train_accelerate.py
imports it before its signal handlers are installed, and the methods import torch (~1 s).
"""

from __future__ import annotations

import argparse
import difflib
import dataclasses
import json
import sys
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import ConfigError
from .fields import above, check_fields, help_of, sections, setting
from .secrets import SECRET_FIELDS, scrub_text

if typing.TYPE_CHECKING:
    from .timesteps.base import TimestepSampler

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
            method = _methods().method(self.timestep_sampler)
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
    def method(self) -> type[TimestepSampler]:
        """The class of the configured timestep method."""
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
            options = set(_methods().option_names(_methods().method(spec)))
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
    """adaptive.timesteps.registry, imported on first use (see the module docstring: it imports torch)."""
    from .timesteps import registry  # imports torch: the config and --help load without it

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


# Presets are plain dicts of the fields they set; everything else keeps the dataclass default.
_TINY_MODEL = dict(
    block_out_channels=(32, 64, 64),
    layers_per_block=1,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=8,  # UNet2DModel's default, as the benchmark protocol's model
    dropout=0.0,
    # PROTOCOL.md v4: 4-8 channels per GroupNorm group, as ddpm-cifar10 (128 / 32). The default 32 groups put one
    # channel in each group at the first level and in the output head (protocol v1-v3): a long colour-blob phase
    # the users' model does not have (docs/adaptive.md).
    norm_num_groups=8,
)
# ddpm-cifar10's topology at a quarter of its width (PROTOCOL.md v4, "Toward the users' model").
_SMALL_MODEL = dict(
    block_out_channels=(32, 64, 64, 64),
    layers_per_block=2,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=None,
    dropout=0.1,
    norm_num_groups=8,
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
    # ddpm-cifar10 at a quarter width (~2.2M parameters), 32 px, with the CPU presets' training settings.
    "cpu-small": dict(resolution=32, **_SMALL_MODEL, **_TINY_TRAINING),
}

# Closed sets of values, checked by the parser (one-line error on anything else); each field's `choices`.
CHOICES: dict[str, tuple] = {"preset": tuple(PRESETS),
                             **{f.name: f.metadata["choices"] for f in fields(TrainConfig) if "choices" in f.metadata}}
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
        self.exit(2, f"{self.prog}: error: {scrub_text(message, getattr(self, '_argv', []))}"
                     f"{self.did_you_mean(message)}\n")

    def did_you_mean(self, message: str) -> str:
        """'; did you mean --learning_rate?' for each unrecognised flag with a near namesake ('' when none)."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for token in message.split(":", 1)[1].split():
            if token.startswith("--"):
                near = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.75)
                hints += [(near[0], token.split("=", 1)[0])] if near else []
        if len(hints) == 1:
            return f"; did you mean {hints[0][0]}?"
        return f"; did you mean {', '.join(f'{n} (for {t})' for n, t in hints)}?" if hints else ""


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


def help_text(f: dataclasses.Field, presets: bool = True) -> str:
    """The field's help, its default (none shown for an empty list) and the presets that set it otherwise."""
    default = f.default
    by_preset = {p: v[f.name] for p, v in PRESETS.items() if f.name in v and v[f.name] != default} if presets else {}
    shown = ([] if default == () else [f"default {_fmt_default(default)}"])
    shown += [f"{p}: {_fmt_default(v)}" for p, v in by_preset.items()]
    return (f"{help_of(f)} [{'; '.join(shown)}]" if shown else help_of(f)).replace("%", "%%")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each flag's default as `[default X]`, unless its help says it already or there is none to show
    (None, False, an empty list)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if ("[default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or (isinstance(default, (list, tuple)) and not default)):
            return text
        return f"{text} [default {_fmt_default(default).replace('%', '%%')}]"


def parse_train_args(argv=None, prog: str = "train_accelerate.py", description: typing.Optional[str] = None):
    """train_accelerate.py's command line: every TrainConfig field as a flag, plus --config FILE and
    --print_config (what the training script and the benchmarks' cost measurement parse)."""
    parser = OneLineParser(prog=prog, description=description)
    parser.add_argument("--config", default=None, help="start from a saved config (a run's config.json); flags given "
                                                       "override it")
    parser.add_argument("--print_config", action="store_true", help="print the resolved config (JSON) and exit")
    add_config_arguments(parser, sys.argv[1:] if argv is None else list(argv))
    return parser.parse_args(argv)


def add_config_arguments(parser: argparse.ArgumentParser, argv: typing.Optional[list[str]] = None) -> None:
    """One flag per config field, grouped by section, default None so that presets can fill the gaps; then one
    section per timestep method with its options (the built-in ones, and a `pkg.module:Class` named in `argv`)."""
    hints = typing.get_type_hints(TrainConfig)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in config_fields().values():
        section = sections(TrainConfig)[f.name]
        group = groups.setdefault(section, parser.add_argument_group(section))
        metavar = "{" + ",".join(_methods().METHODS) + "}|pkg.module:Class" if f.name == "timestep_sampler" else None
        _add_flag(group, f, hints[f.name], help_text(f), CHOICES.get(f.name), metavar)
    for cls in methods_named(argv):
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0]
        group = parser.add_argument_group(f"timestep method {cls.name} (--timestep_sampler {method_spec(cls)})",
                                          " ".join(doc.split()) or None)
        hints = typing.get_type_hints(cls.Options)
        for f in fields(cls.Options):
            _add_flag(group, f, hints[f.name], help_text(f, presets=False), f.metadata.get("choices"))


def method_spec(cls) -> str:
    """What --timestep_sampler takes for a method class: its name, or pkg.module:Class for one not registered."""
    return cls.name if _methods().METHODS.get(cls.name) is cls else f"{cls.__module__}:{cls.__qualname__}"


def methods_named(argv: typing.Optional[list[str]]) -> list:
    """The registered methods and the `pkg.module:Class` given as --timestep_sampler in `argv` (if any)."""
    found = list(_methods().METHODS.values())
    for i, arg in enumerate(argv or []):
        value = argv[i + 1] if arg == "--timestep_sampler" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--timestep_sampler=") else None)
        if value and value not in _methods().METHODS and _methods().EXTERNAL.match(value):
            cls = _methods().method(value)
            if cls not in found:
                found.append(cls)
    return found


def _add_flag(group, f: dataclasses.Field, hint, help: str, choices: typing.Optional[tuple],
              metavar: typing.Optional[str] = None) -> None:
    tp, optional = _base_type(hint)
    kw: dict = dict(default=None, help=help, **({"metavar": metavar} if metavar else {}))
    if tp is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        kw["type"] = lambda s, elem=elem: [elem(x) for x in s.split(",") if x]
        kw["nargs"] = "+"
        kw["metavar"] = elem.__name__.upper()
    else:
        kw["type"] = _optional(tp) if optional else tp
        if choices:
            kw["choices"] = list(choices) + ([EXPLICIT_NONE] if optional else [])
            kw["metavar"] = "{" + ",".join(choices) + "}"
    group.add_argument(f"--{f.name}", **kw)


# Keys of a saved config that are never taken over: they say what this invocation should do to the folder.
NOT_INHERITED = ("overwrite_output_dir", "resume_from_checkpoint")


def resolve_config(args: argparse.Namespace, saved: typing.Optional[dict] = None) -> TrainConfig:
    """Dataclass defaults <- preset <- a saved config (a run's config.json or --config file) <- flags that were given;
    the method's options likewise (a flag of another method than the chosen one is an error)."""
    saved = {k: v for k, v in (saved or {}).items() if k not in NOT_INHERITED and k not in SECRET_FIELDS}
    preset_name = getattr(args, "preset", None) or saved.get("preset") or TrainConfig.preset
    if preset_name not in PRESETS:
        raise ConfigError(f"unknown preset {preset_name!r} (choose from {', '.join(PRESETS)})")
    chosen = getattr(args, "timestep_sampler", None) or saved.get("timestep_sampler") or PRESETS[preset_name].get(
        "timestep_sampler", TrainConfig.timestep_sampler)
    method = _methods().method(chosen)
    saved = current_keys({**saved, "timestep_sampler": chosen})
    options = _methods().option_names(method)
    unknown = sorted(set(saved) - set(config_fields()) - set(options))
    if unknown:
        raise ConfigError(f"the saved config has unknown keys: {', '.join(unknown)}")
    values = {**PRESETS[preset_name], **{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()},
              "preset": preset_name}
    hints = {**typing.get_type_hints(TrainConfig), **typing.get_type_hints(method.Options)}
    for name, v in vars(args).items():
        if v is None or (name not in config_fields() and name not in options):
            if v is not None and (owner := _methods().owner_of(name)) is not None:
                raise ConfigError(f"--{name} is an option of --timestep_sampler {owner.name}, not of {chosen}")
            continue
        if v is EXPLICIT_NONE:
            v = None
        elif typing.get_origin(_base_type(hints[name])[0]) is tuple:
            v = tuple(x for part in v for x in (part if isinstance(part, list) else [part]))
        values[name] = v
    cfg = TrainConfig(**{k: v for k, v in values.items() if k in config_fields()},
                      timestep_options={k: v for k, v in values.items() if k in options})
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Raises ConfigError naming the first invalid value."""
    if not cfg.output_dir.strip():
        raise ConfigError("--output_dir must name a folder (an empty value would train into the current directory)")
    check_fields(cfg)  # every field: finite, one of its choices, its own check
    check_fields(cfg.method.Options(**cfg.timestep_options) if isinstance(cfg.timestep_options, typing.Mapping)
                 else cfg.timestep_options)  # a user's method that did not import: raises its import error first
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
    for name in ["lr_warmup_steps", "dataloader_num_workers"]:
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
    levels = len(cfg.block_out_channels)
    if len(cfg.down_block_types) != levels or len(cfg.up_block_types) != levels:
        raise ConfigError("--down_block_types, --up_block_types and --block_out_channels must have the same length")
    if cfg.resolution % (2 ** (len(cfg.block_out_channels) - 1)) != 0:
        raise ConfigError(f"--resolution {cfg.resolution} must be divisible by 2^(levels-1) = "
                          f"{2 ** (len(cfg.block_out_channels) - 1)}")
    if any(c % cfg.norm_num_groups for c in cfg.block_out_channels):
        raise ConfigError(f"every --block_out_channels value must be divisible by --norm_num_groups "
                          f"{cfg.norm_num_groups}")
    if not 0.0 < cfg.ddpm_beta_start < cfg.ddpm_beta_end < 1.0:
        raise ConfigError("betas must satisfy 0 < --ddpm_beta_start < --ddpm_beta_end < 1")
    if cfg.ema_snapshot_steps < 1:
        raise ConfigError("--ema_snapshot_steps must be >= 1")
    if any(not 0.0 < s < 0.289 for s in cfg.ema_snapshots):
        raise ConfigError("--ema_snapshots values are sigma_rel in (0, 0.289) (EDM2 uses 0.05 0.10)")
    cfg.method.check_options(cfg.timestep_options, cfg)
    if any(s < 1 for s in cfg.eval_at_steps):
        raise ConfigError("--eval_at_steps must be positive step numbers")
    if cfg.eval_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--eval_inference_steps cannot exceed --ddpm_num_steps")
    if cfg.ddpm_num_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--ddpm_num_inference_steps cannot exceed --ddpm_num_steps")


def replace(cfg: TrainConfig, **changes) -> TrainConfig:
    """`cfg` with some fields or method options changed (options of the method the result has)."""
    own = {k: v for k, v in changes.items() if k in config_fields() or k == "timestep_options"}
    options = {k: v for k, v in changes.items() if k not in own}
    out = dataclasses.replace(cfg, **own)
    if options:
        out = dataclasses.replace(out, timestep_options=dataclasses.replace(out.timestep_options, **options))
    return out


# Re-scoring a run as it was scored (`sample.py` / `evaluate_fid.py --like_run RUN`): a CLI's table maps its flags to
# (default, the run config's field); a flag not given takes the run's value, else its default.


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
