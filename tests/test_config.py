"""Config: presets, flag resolution, JSON round trip, validation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from adaptive.config import PRESETS, ConfigError, TrainConfig, config_fields, replace, resolve_config
from adaptive.fields import help_of
from adaptive.timesteps import METHODS
from adaptive.model import build_noise_scheduler, build_unet, count_parameters
from train_accelerate import main, parse_args


def test_every_field_and_method_option_has_help_and_a_flag():
    args = parse_args([])
    every = [*config_fields().values(), *(f for m in METHODS.values() for f in dataclasses.fields(m.Options))]
    for f in every:
        assert help_of(f), f"field {f.name} has no help"
        assert hasattr(args, f.name)


def test_help_is_data_and_fits_in_120_columns(capsys):
    """--help: every method has its own section with its options; no source line of the config over 120 columns."""
    from pathlib import Path

    import adaptive.config

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    for name, cls in METHODS.items():
        assert f"timestep method {name} (--timestep_sampler {name})" in out
        assert all(f"--{f.name}" in out for f in dataclasses.fields(cls.Options))
    package = Path(adaptive.config.__file__).parent  # adaptive/config/: settings, presets, checks, cli
    assert max(len(line) for f in package.glob("*.py") for line in f.read_text().splitlines()) <= 120


def test_ddpm_cifar10_preset_is_the_papers_model():
    cfg = resolve_config(parse_args(["--preset", "ddpm-cifar10"]))
    assert count_parameters(build_unet(cfg)) == 35_746_307  # Ho et al. 2020: 35.7M
    assert (cfg.learning_rate, cfg.lr_warmup_steps, cfg.train_batch_size, cfg.max_train_steps) == \
        (2e-4, 5000, 128, 800_000)
    assert (cfg.dropout, cfg.max_grad_norm, cfg.ema_max_decay, cfg.random_flip) == (0.1, 1.0, 0.9999, True)
    s = build_noise_scheduler(cfg)
    assert s.config.num_train_timesteps == 1000 and s.config.beta_schedule == "linear"
    assert (s.config.beta_start, s.config.beta_end, s.config.prediction_type) == (1e-4, 0.02, "epsilon")


def test_cpu_tiny16_is_exactly_the_benchmark_protocol():
    """shared/benchmark/PROTOCOL.md v4, 'Fixed setting' table."""
    cfg = resolve_config(parse_args(["--preset", "cpu-tiny16"]))
    unet = build_unet(cfg)
    c = unet.config
    assert c.sample_size == 16 and tuple(c.block_out_channels) == (32, 64, 64) and c.layers_per_block == 1
    assert tuple(c.down_block_types) == ("DownBlock2D", "AttnDownBlock2D", "DownBlock2D")
    assert tuple(c.up_block_types) == ("UpBlock2D", "AttnUpBlock2D", "UpBlock2D")
    assert c.attention_head_dim == 8 and c.dropout == 0.0  # UNet2DModel defaults
    assert c.norm_num_groups == 8  # v4: 4-8 channels per GroupNorm group, as ddpm-cifar10 (v1-v3: 32, one channel)
    assert 1.0e6 < count_parameters(unet) < 1.2e6
    assert (cfg.learning_rate, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_weight_decay) == (2e-3, 0.9, 0.999, 0.0)
    assert (cfg.lr_scheduler, cfg.lr_warmup_steps, cfg.max_grad_norm, cfg.train_batch_size) == \
        ("constant_with_warmup", 200, 1.0, 128)
    assert cfg.mixed_precision == "bf16" and cfg.random_flip
    assert (cfg.use_ema, cfg.ema_max_decay, cfg.ema_warmup) == (True, 0.995, "ratio")
    assert cfg.max_train_steps == 2000 and cfg.ddpm_num_inference_steps == 50
    assert (cfg.ddpm_num_steps, cfg.ddpm_beta_schedule, cfg.prediction_type) == (1000, "linear", "epsilon")


def test_cpu_small_is_ddpm_cifar10_at_a_quarter_width():
    """PROTOCOL.md v4, 'Toward the users' model': ddpm-cifar10's topology with every width divided by 4."""
    small = build_unet(resolve_config(parse_args(["--preset", "cpu-small"]))).config
    full = build_unet(resolve_config(parse_args(["--preset", "ddpm-cifar10"]))).config
    assert tuple(small.block_out_channels) == tuple(c // 4 for c in full.block_out_channels) == (32, 64, 64, 64)
    same = ("sample_size", "layers_per_block", "down_block_types", "up_block_types", "attention_head_dim", "dropout")
    assert {k: small[k] for k in same} == {k: full[k] for k in same}
    assert small.norm_num_groups == 8 and full.norm_num_groups == 32  # 4 channels per group at the narrowest level


def test_flags_override_the_preset_and_the_config_round_trips():
    cfg = resolve_config(parse_args(["--preset", "cpu-tiny16", "--learning_rate", "1e-3",
                                     "--block_out_channels", "32,64", "--down_block_types", "DownBlock2D",
                                     "AttnDownBlock2D", "--up_block_types", "AttnUpBlock2D,UpBlock2D",
                                     "--no-random_flip", "--max_train_steps", "none", "--num_epochs", "3"]))
    assert cfg.learning_rate == 1e-3 and cfg.block_out_channels == (32, 64) and cfg.random_flip is False
    assert cfg.down_block_types == ("DownBlock2D", "AttnDownBlock2D") and cfg.max_train_steps is None
    assert cfg.lr_warmup_steps == 200  # still the preset's
    again = TrainConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg


@pytest.mark.parametrize("argv, message", [
    (["--resolution", "0"], "--resolution must be >= 1"),
    (["--block_out_channels", "32,64"], "same length"),
    (["--resolution", "18"], "divisible"),
    (["--max_train_steps", "none"], "--max_train_steps or --num_epochs"),
    (["--ddpm_beta_start", "0.5"], "betas"),
    (["--timestep_sampler", "adaptive", "--adaptive_loss_scale", "0"], "--adaptive_loss_scale must be > 0"),
    (["--timestep_sampler", "adaptive", "--adaptive_bins", "7"], "--adaptive_bins 7 must divide --ddpm_num_steps 1000"),
    (["--adaptive_bins", "50"], "--adaptive_bins is an option of --timestep_sampler adaptive, not of uniform"),
    (["--timestep_sampler", "no_such"], "--timestep_sampler 'no_such' is not one of uniform"),
    (["--timestep_sampler", "no_such_pkg.mod:Cls"], "--timestep_sampler no_such_pkg.mod:Cls: cannot import it"),
])
def test_invalid_values_are_one_line_errors(argv, message, capsys):
    assert main(["--preset", "cpu-tiny16", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_hub_dataset_with_an_img_column(tmp_path):
    """Any `datasets` dataset with an image column (CIFAR-10 on the Hub calls it 'img'); a local repo stands in."""
    import datasets
    import numpy as np
    from PIL import Image

    from adaptive.data import decode_all, open_entries

    imgs = [Image.fromarray(np.full((32, 32, 3), 10 * i, np.uint8)) for i in range(5)]
    ds = datasets.Dataset.from_dict({"img": imgs, "label": list(range(5))}).cast_column("img", datasets.Image())
    (tmp_path / "repo" / "data").mkdir(parents=True)
    ds.to_parquet(str(tmp_path / "repo" / "data" / "train-00000-of-00001.parquet"))
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "dataset_name": str(tmp_path / "repo"),
                         "cache_dir": str(tmp_path / "cache")})
    x = decode_all(open_entries(cfg), 16)
    assert x.shape == (5, 3, 32, 32) and x[3].float().mean().item() == 30
    cfg = replace(cfg, image_column="picture")
    with pytest.raises(ConfigError, match="--image_column 'picture' is not a column"):
        open_entries(cfg)


def _printed_config(capsys, *argv) -> dict:
    assert main([*map(str, argv), "--print_config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_print_config_resolves_preset_saved_config_and_flags_in_that_order(tmp_path, capsys):
    cfg = _printed_config(capsys, "--preset", "cpu-tiny16", "--learning_rate", "1e-3")
    assert cfg["learning_rate"] == 1e-3 and cfg["lr_warmup_steps"] == 200 and cfg["preset"] == "cpu-tiny16"
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({**cfg, "seed": 7, "overwrite_output_dir": True}))
    cfg = _printed_config(capsys, "--config", saved, "--lr_warmup_steps", "10")
    assert (cfg["learning_rate"], cfg["seed"], cfg["lr_warmup_steps"], cfg["preset"]) == (1e-3, 7, 10, "cpu-tiny16")
    assert cfg["overwrite_output_dir"] is False  # never inherited: it says what to do with the folder
    (tmp_path / "bad.json").write_text(json.dumps({"learning_rte": 1.0}))
    assert main(["--config", str(tmp_path / "bad.json")]) == 2
    assert "unknown keys: learning_rte" in capsys.readouterr().err


def test_resume_takes_the_runs_saved_config_and_flags_override_it(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    saved = _printed_config(capsys, "--preset", "cpu-tiny16", "--learning_rate", "1e-3", "--output_dir", run)
    (run / "config.json").write_text(json.dumps(saved))
    cfg = _printed_config(capsys, "--output_dir", run, "--resume_from_checkpoint", "latest")
    assert cfg["preset"] == "cpu-tiny16" and cfg["learning_rate"] == 1e-3 and cfg["resume_from_checkpoint"] == "latest"
    cfg = _printed_config(capsys, "--output_dir", run, "--resume_from_checkpoint", "latest", "--max_train_steps", "9")
    assert cfg["max_train_steps"] == 9 and cfg["learning_rate"] == 1e-3
    # a checkpoint path brings its own config (and with it the output folder)
    (run / "checkpoint-5").mkdir()
    (run / "checkpoint-5" / "config.json").write_text(json.dumps({**saved, "seed": 3}))
    cfg = _printed_config(capsys, "--resume_from_checkpoint", run / "checkpoint-5")
    assert cfg["seed"] == 3 and cfg["output_dir"] == str(run)
    # a new run (no config.json yet) with the same command is just a new run
    assert _printed_config(capsys, "--output_dir", tmp_path / "new", "--resume_from_checkpoint",
                           "latest")["preset"] == "ddpm-cifar10"


def test_help_is_grouped_by_section_and_shows_the_presets_defaults(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    model = text[text.index("model (UNet2DModel):"):text.index("diffusion (DDPMScheduler):")]
    assert "--block_out_channels" in model and "cpu-tiny16: 32,64,64" in model and "--learning_rate" not in model
    optim = text[text.index("optimisation:"):]
    assert "--learning_rate" in optim \
        and "[default 0.0002; cpu-tiny: 0.002; cpu-tiny16: 0.002; cpu-small: 0.002]" in " ".join(optim.split())


@pytest.mark.parametrize("script", ["train_accelerate", "sample", "evaluate_fid", "reconstruct_ema"])
def test_every_clis_help_shows_its_defaults_and_no_empty_one(script, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(script).parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[default ]" not in text and "[default ()]" not in text
    expected = {
        "train_accelerate": ["sigma_rel of power-function EMAs kept for post-hoc EMA (EDM2: 0.05 0.10) "
                             "--ema_snapshot_steps", "[default 5000]"],
        "sample": ["images to generate (indices 0 .. N-1) [default 10000; --like_run: the run's eval_num_images]",
                   "[default ddpm]",
                   "[default: the accelerate config's choice; --like_run: the run's mixed_precision]"],
        "evaluate_fid": ["[default clean; --like_run: the run's eval_mode]", "images per feature-network batch "
                         "[default 250]", "[default: all; --like_run: the run's eval_ref_num_images]"],
        "reconstruct_ema": ["[default: the last snapshot]", "[default: run_dir/phema-<sigma>]"],
    }[script]
    for part in expected:
        assert part in text, part


def test_a_presets_precision_over_the_accelerate_configs_is_said_at_the_start(tmp_path, capsys, monkeypatch):
    from adaptive.config import precision_override

    cfg = resolve_config(parse_args(["--preset", "cpu-tiny16"]))
    assert precision_override(cfg, None, {}, "no") == (
        "mixed_precision bf16 (from preset cpu-tiny16) overrides the accelerate config's no; pass --mixed_precision no "
        "to use that")
    assert "from the run's saved config" in precision_override(cfg, None, {"mixed_precision": "bf16"}, "no")
    assert precision_override(cfg, "bf16", {}, "no") is None  # a flag is the user's own choice
    assert precision_override(cfg, None, {}, "bf16") is None and precision_override(cfg, None, {}, None) is None
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # as accelerate launch sets it from its config
    assert main(["--preset", "cpu-tiny16", "--train_data_dir", str(tmp_path / "missing"), "--output_dir",
                 str(tmp_path / "run")]) == 2
    out = capsys.readouterr()
    assert out.out.startswith("mixed_precision bf16 (from preset cpu-tiny16) overrides the accelerate config's no")
    assert "does not exist" in out.err


def test_like_run_fills_only_the_flags_not_given():
    import argparse

    from adaptive.config import fill_like_run

    table = {"num_images": (10_000, "eval_num_images"), "seed_offset": (0, "eval_seed_offset")}
    run = TrainConfig(**PRESETS["cpu-tiny16"])
    args = fill_like_run(argparse.Namespace(num_images=None, seed_offset=5, other=1), table, run)
    assert (args.num_images, args.seed_offset, args.other) == (1000, 5, 1)  # the run's eval_num_images; the flag given
    args = fill_like_run(argparse.Namespace(num_images=None, seed_offset=None), table, None)
    assert (args.num_images, args.seed_offset) == (10_000, 0)  # no run: the defaults


def test_like_run_takes_every_setting_of_the_runs_evaluation(tmp_path):
    """Issue 29.2: sample.py --like_run takes the run's seeds, sampling steps, precision, image count, batch and
    attention kernel (the sampler is DDPM ancestral, as the evaluation's); evaluate_fid.py --like_run its image count,
    feature network, mode and reference subset. A flag given wins."""
    import evaluate_fid
    import sample

    run = TrainConfig(**{**PRESETS["cpu-tiny16"], "eval_num_images": 37, "eval_seed_offset": 12345,
                         "eval_inference_steps": 7, "eval_batch_size": 9, "mixed_precision": "fp16",
                         "attention_impl": "classic", "eval_feature_extractor": "feat.pt",
                         "eval_mode": "legacy_pytorch", "eval_ref_num_images": 321})
    (tmp_path / "config.json").write_text(run.to_json())
    s = sample.resolve_args(sample.parse_args(["--model_path", "m", "--output_dir", "o", "--like_run", str(tmp_path)]))
    assert (s.num_images, s.seed_offset, s.num_inference_steps, s.batch_size, s.mixed_precision, s.attention_impl,
            s.scheduler) == (37, 12345, 7, 9, "fp16", "classic", "ddpm")
    given = sample.resolve_args(sample.parse_args(["--model_path", "m", "--output_dir", "o", "--like_run",
                                                   str(tmp_path), "--num_inference_steps", "3"]))
    assert (given.num_inference_steps, given.seed_offset) == (3, 12345)
    e, loaded = evaluate_fid.resolve_args(evaluate_fid.parse_args(["--samples", "s", "--like_run", str(tmp_path)]))
    assert (e.num_images, e.feature_extractor, e.mode, e.ref_num_images) == (37, "feat.pt", "legacy_pytorch", 321)
    assert loaded == run  # and, with no reference given, the run's own (evaluate_fid.run_reference)
