"""Training through the real CLI: two gloo ranks, DDP == single process, accumulation == big batch, bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from adaptive.build import cpu_has_native_bf16
from adaptive.config import PRESETS, TrainConfig
from adaptive.model import build_unet
from adaptive.seeding import seed_for

from conftest import run_cli, tiny_args, write_pooled_features

pytestmark = pytest.mark.slow


def test_two_ranks_really_train_end_to_end(tmp_path, image_zip):
    out = tmp_path / "run"
    proc = run_cli("train_accelerate.py", tiny_args(image_zip, out, "--max_train_steps", "4", "--logging_steps", "2",
                                                  "--save_images_steps", "2", "--checkpointing_steps", "2",
                                                  preset_precision=True), nproc=2)
    assert "world_size=2" in proc.stdout
    # bf16 autocast on a CPU without native bf16 is emulated (10x slower): the run says so, once, and only there
    assert proc.stdout.count("bf16 autocast is emulated") == (0 if cpu_has_native_bf16() else 1)
    records = [json.loads(l) for l in (out / "stats.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert all(r["world_size"] == 2 and r["images"] == r["step"] * 8 for r in records)
    assert all(r["loss"] > 0 for r in records)
    assert (out / "samples" / "grid_0000002.png").is_file() and (out / "samples" / "grid_0000004.png").is_file()
    assert json.loads((out / "run_info.json").read_text())["world_size"] == 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["resolution"] == 16 and cfg["preset"] == "cpu-tiny16" and cfg["mixed_precision"] == "bf16"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (out / "checkpoint-4").iterdir()}


def _params(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / f"checkpoint-{step}" / "model.safetensors"))


def test_ddp_and_gradient_accumulation_match_one_big_batch(tmp_path, image_folder):
    """2 ranks x 4 == 1 process x 8 == accumulate 2 x 4 (same samples, noise and timesteps), in fp32.

    adam_epsilon 1 makes the first Adam updates ~linear in the gradient (with eps ~ 0 they are lr * sign(g), which
    amplifies float rounding of near-zero gradients), so equal parameters mean equal gradients.
    """
    common = ["--max_train_steps", "2", "--mixed_precision", "no", "--lr_scheduler", "constant",
              "--lr_warmup_steps", "0", "--adam_epsilon", "1.0", "--learning_rate", "0.1",
              "--checkpointing_steps", "1", "--save_images_steps", "none", "--logging_steps", "1"]
    runs = {
        "big": (tiny_args(image_folder, tmp_path / "big", *common, "--train_batch_size", "8"), 1),
        "ddp": (tiny_args(image_folder, tmp_path / "ddp", *common, "--train_batch_size", "4"), 2),
        "accum": (tiny_args(image_folder, tmp_path / "accum", *common, "--train_batch_size", "4",
                            "--gradient_accumulation_steps", "2"), 1),
    }
    for name, (args, nproc) in runs.items():
        run_cli("train_accelerate.py", args, nproc=nproc)
    torch.manual_seed(seed_for(0, "init"))
    init = build_unet(TrainConfig(**PRESETS["cpu-tiny16"])).state_dict()
    for step in (1, 2):
        big = _params(tmp_path / "big", step)
        moved = max((big[k] - init[k]).abs().max().item() for k in big)
        assert moved > 1e-4  # the step really changed the weights
        for other in ("ddp", "accum"):
            p = _params(tmp_path / other, step)
            diff = max((p[k] - big[k]).abs().max().item() for k in big)
            assert diff < 1e-3 * moved, (other, step, diff, moved)
    losses = {n: [json.loads(l)["loss"] for l in (tmp_path / n / "stats.jsonl").read_text().splitlines()] for n in runs}
    assert losses["ddp"] == pytest.approx(losses["big"], rel=1e-5)
    assert losses["accum"] == pytest.approx(losses["big"], rel=1e-5)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_bad_input_never_touches_an_existing_run(tmp_path, image_folder):
    out = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, out, "--max_train_steps", "2",
                                             "--save_images_steps", "none"))
    before = _snapshot(out)
    corrupt = tmp_path / "corrupt"
    (corrupt / "a").mkdir(parents=True)
    (corrupt / "a" / "x.png").write_bytes(b"not a png")
    cases = {
        "already holds a run": tiny_args(image_folder, out, "--max_train_steps", "2"),
        "cannot read image 'a/x.png'": tiny_args(corrupt, out, "--overwrite_output_dir", "--max_train_steps", "2"),
        "does not exist": tiny_args(tmp_path / "missing", out, "--overwrite_output_dir"),
        "invalid choice: 'huge'": ["--preset", "huge", "--output_dir", str(out)],
        "invalid choice: 'sometimes'": tiny_args(image_folder, out, "--lr_scheduler", "sometimes"),
        "unrecognized arguments: --bogus": tiny_args(image_folder, out, "--bogus", "1"),
        "different model/objective (block_out_channels: 32,64,64 -> 32,32,64)": tiny_args(
            image_folder, out, "--resume_from_checkpoint", "latest", "--block_out_channels", "32,32,64"),
    }
    for message, args in cases.items():
        proc = run_cli("train_accelerate.py", args, check=False)
        assert proc.returncode == 2, (message, proc.stderr[-2000:])
        err_lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
        assert len(err_lines) == 1 and message in err_lines[0], (message, proc.stderr[-2000:])
        assert _snapshot(out) == before, message


def test_kim2025_policy_updates_inside_real_training(tmp_path, image_folder):
    """The policy update (VLB before/after the model step, every 40 steps) runs in the loop and is checkpointed."""
    from adaptive.checkpoint import load_object_state

    out = tmp_path / "kim"
    run_cli("train_accelerate.py", tiny_args(image_folder, out, "--timestep_sampler", "kim2025",
                                             "--max_train_steps", "41", "--save_images_steps", "none",
                                             "--logging_steps", "41"))
    state = load_object_state(out / "checkpoint-41" / "training_state.pt")["sampler"]
    assert state["updates"] == 2 and state["filled"] == 2  # steps 0 and 40
    assert state["buffer_x"][:2].abs().sum() > 0
    assert not torch.equal(state["policy"]["head.4.bias"], torch.full((2,), 0.5))  # REINFORCE moved the policy


def test_in_training_evaluation_and_the_wall_clock_budget(tmp_path, image_folder):
    """--eval_at_steps writes proxy-FD records with the training wall-clock; --max_train_minutes stops, saves,
    exports."""
    feat = write_pooled_features(tmp_path / "feat.pt")
    out = tmp_path / "run"
    proc = run_cli("train_accelerate.py", tiny_args(
        image_folder, out, "--max_train_steps", "100000", "--max_train_minutes", "0.25", "--eval_at_steps", "1,2",
        "--eval_num_images", "8", "--eval_inference_steps", "3", "--eval_feature_extractor", str(feat),
        "--eval_ref_num_images", "16", "--save_images_steps", "none", "--checkpointing_steps", "100000"))
    records = [json.loads(l) for l in (out / "stats.jsonl").read_text().splitlines()]
    evals = [r for r in records if "proxy_fd" in r]
    last = int(next(out.glob("checkpoint-*")).name.split("-")[1])  # the step the budget stopped the run at
    # step 1's evaluation always runs (the budget is checked after it); step 2's unless step 1 alone spent the budget
    assert [r["step"] for r in evals] == [s for s in (1, 2) if s <= last] and last >= 1
    assert all(r["proxy_fd"] > 0 and r["train_seconds"] > 0 and r["eval_images"] == 8 for r in evals)
    assert "stopping after step" in proc.stdout and "--max_train_minutes budget of 0.25 min spent" in proc.stdout
    from adaptive.checkpoint import load_object_state

    ckpt = next(out.glob("checkpoint-*"))
    spent = load_object_state(ckpt / "training_state.pt")["progress"]["train_seconds"]
    assert 15 <= spent < 15 + 60  # stopped at the first step after the budget (evaluation time excluded)
    assert (out / "model_index.json").is_file() and len(list(out.glob("checkpoint-*"))) == 1
    assert "proxy FD (not FID)" in (out / "README.md").read_text()


def test_trackers_get_the_plotted_scalars_the_sample_grids_and_timestep_bins_only_when_asked(tmp_path, image_folder):
    """TensorBoard: loss, lr, grad_norm, img_per_s every log step, the evaluation's score (its bookkeeping only in
    stats.jsonl) and the grid as an image at --save_images_steps; the per-bin diagnostics under timesteps/ for a
    non-uniform method (or --log_timestep_bins), not for plain uniform."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def tags(name: str, *extra: str) -> tuple[set, set]:
        run = tmp_path / name
        run_cli("train_accelerate.py", tiny_args(image_folder, run, "--max_train_steps", "4", "--logging_steps", "2",
                                                 "--save_images_steps", "2", "--logger", "tensorboard", *extra))
        acc = EventAccumulator(str(run / "logs" / "adaptive-diffusion")).Reload()  # logging_dir / project name
        scalars, images = set(acc.Tags()["scalars"]), set(acc.Tags()["images"])
        assert [e.step for e in acc.Images("samples")] == [2, 4] if "samples" in images else False
        tags.histograms = set(acc.Tags()["histograms"])
        return scalars, images

    feat = write_pooled_features(tmp_path / "feat.pt")
    scalars, images = tags("uniform", "--eval_at_steps", "4", "--eval_num_images", "4", "--eval_inference_steps", "2",
                           "--eval_feature_extractor", str(feat), "--eval_ref_num_images", "8")
    assert {"loss", "lr", "grad_norm", "img_per_s"} <= scalars and "samples" in images
    assert not any(t.startswith("timesteps/") for t in scalars) and "world_size" not in scalars
    assert {t for t in scalars if t.startswith("eval/")} == {"eval/proxy_fd"}
    evals = [json.loads(line) for line in (tmp_path / "uniform" / "stats.jsonl").read_text().splitlines()
             if "proxy_fd" in line]
    assert evals[0]["eval_images"] == 4 and evals[0]["eval_inference_steps"] == 2 and "eval_seconds" in evals[0]
    assert not tags.histograms
    scalars, _ = tags("adaptive", "--timestep_sampler", "adaptive", "--adaptive_warmup_steps", "1")
    assert {"timesteps/loss_scale", "timesteps/p_entropy"} <= scalars  # per-bin lists: one histogram each (issue 56)
    assert "timesteps/p_by_t" in tags.histograms and not any(t.endswith("_0") for t in scalars)
    scalars, _ = tags("asked", "--log_timestep_bins")
    assert "timesteps/loss_by_t" in tags.histograms and "timesteps/p_ess" in scalars
