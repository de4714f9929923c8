"""Timestep methods own themselves: the registry (choices, flags, validation, saved config), a user's method from a
`pkg.module:Class` path (tests/plugins/, not in the package), configs of older versions, and the loop's three calls."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing

import pytest
import torch

from adaptive.config import PRESETS, ConfigError, TrainConfig, resolve_config
from adaptive.timesteps import METHODS, build_sampler, method
from adaptive.timesteps.base import NEEDS
from conftest import ROOT, tiny_args, write_images
from train_accelerate import main, parse_args

PLUGIN = "tests.plugins.power_sampler:PowerSampler"


def test_every_registered_method_owns_a_frozen_options_class_with_unique_flag_names():
    seen = set(TrainConfig.__dataclass_fields__)
    for name, cls in METHODS.items():
        assert cls.name == name and set(cls.needs) <= set(NEEDS)
        assert dataclasses.is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen
        names = {f.name for f in dataclasses.fields(cls.Options)}
        assert not names & seen, (name, names & seen)
        seen |= names
        cfg = TrainConfig.from_dict({"timestep_sampler": name})
        saved = cfg.to_dict()
        assert names <= set(saved) and TrainConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_help_and_config_read_the_methods_without_importing_them_or_torch():
    """`train_accelerate.py --help`, parsing flags and resolving a config of every built-in method import no torch
    and no method file: the registry reads their declared options (registry.declared)."""
    probe = ("import runpy, sys\n"
             "sys.argv = ['train_accelerate.py', '--help']\n"
             "try:\n    runpy.run_path('train_accelerate.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "from adaptive.config import TrainConfig\nfrom adaptive.timesteps.registry import declared\n"
             "for name in declared():\n    TrainConfig.from_dict({'timestep_sampler': name}).to_json()\n"
             "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('adaptive.timesteps.'))\n"
             "print('LOADED', loaded, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: train_accelerate.py" in out.stdout and "timestep method adaptive" in out.stdout
    assert "LOADED ['adaptive.timesteps.registry']" in out.stderr, out.stderr


def test_the_declared_options_are_the_registered_classes_options():
    """What the configuration reads from a method file is what the imported class has (and every file's method is
    read, in the registry's order)."""
    from adaptive.timesteps.registry import declared, option_signature

    assert list(declared()) == list(METHODS)  # METHODS imports them all
    for name, decl in declared().items():
        assert option_signature(decl.Options) == option_signature(METHODS[name].Options), name
        assert typing.get_type_hints(decl.Options) == typing.get_type_hints(METHODS[name].Options), name
        assert decl.doc and decl.module == METHODS[name].__module__


def test_a_method_file_whose_options_are_not_declarative_is_refused_by_name(tmp_path):
    from adaptive.timesteps.registry import declarations_in

    path = tmp_path / "mine.py"
    path.write_text("import torch\n\n@dataclass(frozen=True)\nclass MineOptions:\n"
                    "    mine_k: float = setting(torch.pi, 'k')\n\n\n@register\nclass Mine(TimestepSampler):\n"
                    "    name = 'mine'\n    Options = MineOptions\n")
    with pytest.raises(ValueError, match=r"mine.py: MineOptions must use only literals.*'torch'"):
        declarations_in(path, {})
    path.write_text(path.read_text().replace("torch.pi", "K").replace("import torch", "K = 2.5"))
    (_, decl), = declarations_in(path, {})
    assert decl.name == "mine" and decl.Options().mine_k == 2.5


def test_the_loop_names_no_method():
    source = (ROOT / "adaptive" / "loop.py").read_text()
    assert "timestep_sampler" not in source
    for name in METHODS:
        assert not re.search(rf"\b{name}\b", source.replace("adaptive.", "").replace("adaptive/", "")
                             .replace("from .", "")), name


def test_a_users_method_plugs_in_by_module_path_with_its_options_as_flags():
    cfg = resolve_config(parse_args(["--preset", "cpu-tiny16", "--timestep_sampler", PLUGIN,
                                     "--power_exponent", "0.3"]))
    assert cfg.timestep_options.power_exponent == 0.3 and cfg.to_dict()["power_exponent"] == 0.3
    assert TrainConfig.from_dict(json.loads(cfg.to_json())) == cfg
    sampler = build_sampler(cfg, "cpu", None)
    assert type(sampler) is method(PLUGIN)
    t = torch.arange(cfg.ddpm_num_steps)  # unbiased: p(t) x 1/(T p(t)) = 1/T
    assert torch.allclose(sampler.probabilities() * sampler.weight_of(t), torch.full((len(t),), 1 / len(t)))
    with pytest.raises(ConfigError, match="--power_exponent must be >= 0"):
        resolve_config(parse_args(["--timestep_sampler", PLUGIN, "--power_exponent", "-1"]))
    with pytest.raises(SystemExit):  # its flags exist only where the method is named
        parse_args(["--power_exponent", "0.3"])


def test_help_shows_a_users_method_in_its_own_section(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--timestep_sampler", PLUGIN, "--help"])
    out = capsys.readouterr().out
    assert f"timestep method power (--timestep_sampler {PLUGIN})" in out and "--power_exponent" in out
    assert "--timestep_sampler {" + ",".join(METHODS) + "}|pkg.module:Class" in out


def test_a_config_of_an_older_version_with_every_methods_options_still_loads():
    """Before the methods owned their options every config.json held all of them; the other methods' are dropped."""
    old = {**TrainConfig.from_dict(PRESETS["cpu-tiny16"]).to_dict(), "uncertainty_lr": 0.01, "speed_k": 5.0,
           "speed_lambda": 0.6, **TrainConfig.from_dict({"timestep_sampler": "adaptive"}).to_dict()}
    old = {**old, "timestep_sampler": "uniform", "adaptive_warmup_steps": 7}
    assert TrainConfig.from_dict(old).timestep_sampler == "uniform"
    assert resolve_config(parse_args([]), saved=old).to_dict().keys() == TrainConfig.from_dict(old).to_dict().keys()
    adaptive = resolve_config(parse_args([]), saved={**old, "timestep_sampler": "adaptive"})
    assert adaptive.timestep_options.adaptive_warmup_steps == 7  # its own options are kept
    with pytest.raises(ConfigError, match="unknown config keys: no_such_key"):
        TrainConfig.from_dict({**old, "no_such_key": 1})


def test_a_users_method_trains_resumes_with_its_saved_options_and_is_called_three_times_a_step(
        tmp_path, fresh_accelerate_state):
    from tests.plugins.power_sampler import CountingPowerSampler

    data, out = write_images(tmp_path / "data"), tmp_path / "run"
    spec = "tests.plugins.power_sampler:CountingPowerSampler"
    common = [*tiny_args(data, out), "--checkpointing_steps", "2", "--save_images_steps", "none",
              "--num_grid_images", "1", "--ddpm_num_inference_steps", "2"]
    CountingPowerSampler.calls.clear()
    assert main([*common, "--max_train_steps", "2", "--gradient_accumulation_steps", "2",
                 "--timestep_sampler", spec, "--power_exponent", "0.25"]) == 0
    assert CountingPowerSampler.calls == ["draw", "around_update", "observe"] * 2
    saved = json.loads((out / "config.json").read_text())
    assert saved["timestep_sampler"] == spec and saved["power_exponent"] == 0.25
    assert main([*common, "--max_train_steps", "3", "--resume_from_checkpoint", "latest"]) == 0  # no method flags
    resumed = json.loads((out / "checkpoint-3" / "config.json").read_text())
    assert resumed["timestep_sampler"] == spec and resumed["power_exponent"] == 0.25
    assert CountingPowerSampler.calls[6:] == ["draw", "around_update", "observe"]


def test_a_run_of_a_users_method_that_does_not_import_here_still_loads_its_config_but_does_not_train():
    """Sampling or scoring a run needs its model settings, not its method: the config loads, training refuses."""
    from adaptive.config import validate

    saved = {**TrainConfig.from_dict(PRESETS["cpu-tiny16"]).to_dict(), "timestep_sampler": "gone_pkg.mod:Gone",
             "gone_rate": 0.5}
    cfg = TrainConfig.from_dict(saved)
    assert cfg.resolution == 16 and cfg.to_dict()["gone_rate"] == 0.5
    with pytest.raises(ConfigError, match="gone_pkg.mod:Gone: cannot import it"):
        validate(cfg)


def test_a_users_method_that_fails_to_build_is_one_line_naming_the_class_the_flag_and_the_cause(
        tmp_path, fresh_accelerate_state, capsys):
    data, out = write_images(tmp_path / "data"), tmp_path / "run"
    spec = "tests.plugins.power_sampler:BrokenPowerSampler"
    code = main([*tiny_args(data, out), "--max_train_steps", "1", "--timestep_sampler", spec])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    line = [l for l in err.splitlines() if "error:" in l]
    assert len(line) == 1 and f"--timestep_sampler {spec}: building BrokenPowerSampler failed: RuntimeError: needs a " \
        "GPU table this machine lacks (power_sampler.py:" in line[0], err
