"""Faults an adversarial user hits (issue 15): nothing is lost, nothing hangs, nothing leaks, and each fault is one
line and a distinct exit status instead of a traceback. One test per item; the item number is in the test's name."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from adaptive.checkpoint import MANIFEST, list_checkpoints, load_ema_weights, verify_checkpoint, write_manifest
from adaptive.config import ConfigError, resolve_config
from adaptive.rundir import lock_output_dir, run_secrets, scrubbed_command

from conftest import ACCELERATE, ROOT, run_cli, tiny_args, write_pooled_features

from benchmarks.drill.harness import SilentHub, rank_pids

SECRET, ENV_SECRET = "hf_FaultsTestSecretToken0123456789", "hf_FaultsTestEnvToken9876543210"


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(proc_or_err, returncode: int, message: str) -> str:
    """The process exited `returncode` with exactly one non-empty stderr line, containing `message`."""
    err = proc_or_err if isinstance(proc_or_err, str) else proc_or_err.stderr
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if not isinstance(proc_or_err, str):
        assert proc_or_err.returncode == returncode, (proc_or_err.returncode, err[-3000:])
    assert len(lines) == 1 and message in lines[0], err[-3000:]
    return lines[0]


def cli(argv, capsys) -> tuple[int, str]:
    """train_accelerate.main in this process: (exit status, stderr)."""
    from train_accelerate import main

    code = main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, image_folder) -> tuple[Path, list[str]]:
    """A finished 2-step run (checkpoint-1, checkpoint-2, post-hoc EMA snapshots, export) and its arguments; given
    a token with --hub_token=... and another in $HF_TOKEN. Tests copy it (`fresh`)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    args = tiny_args(image_folder, run, "--max_train_steps", "2", "--checkpointing_steps", "1", "--logging_steps", "1",
                     "--save_images_steps", "none", "--lr_warmup_steps", "4", "--ema_snapshots", "0.05", "0.10",
                     "--ema_snapshot_steps", "1")
    run_cli("train_accelerate.py", [*args, f"--hub_token={SECRET}"], env={"HF_TOKEN": ENV_SECRET})
    return run, args


def fresh(trained, tmp_path: Path) -> tuple[Path, list[str]]:
    run, args = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy, [str(copy) if a == str(run) else a for a in args]


# ---------------------------------------------------------------------------------------------- data loss


BAD_FLAGS = {"--adam_beta1 2": ["--adam_beta1", "2"], "--learning_rate nan": ["--learning_rate", "nan"],
             "--attention_head_dim 0": ["--attention_head_dim", "0"],
             "--down_block_types Foo Bar Baz": ["--down_block_types", "Foo", "Bar", "Baz"]}


@pytest.mark.slow
def test_1_overwrite_clears_nothing_until_every_check_passed(trained, tmp_path, capsys):
    run, args = fresh(trained, tmp_path)
    before = snapshot(run)
    for name, flags in BAD_FLAGS.items():
        code, err = cli([*args, "--overwrite_output_dir", *flags], capsys)
        assert code == 2, (name, err)
        one_line_error(err, 2, "error:")
        assert snapshot(run) == before, name
    # the latest check of all: the evaluator's feature network (after data, model and optimizer were built)
    (tmp_path / "not_torchscript.pt").write_bytes(b"not a TorchScript archive")
    proc = run_cli("train_accelerate.py", [*args, "--overwrite_output_dir", "--eval_steps", "1",
                                           "--eval_feature_extractor", str(tmp_path / "not_torchscript.pt")],
                   check=False)
    one_line_error(proc, 2, "is not a TorchScript feature network")
    assert snapshot(run) == before


@pytest.mark.slow
def test_2_divergence_stops_the_run_and_saves_nothing_non_finite(tmp_path, image_folder):
    run = tmp_path / "run"
    proc = run_cli("train_accelerate.py", tiny_args(
        image_folder, run, "--learning_rate", "1e4", "--max_grad_norm", "0", "--lr_warmup_steps", "0",
        "--max_train_steps", "30", "--checkpointing_steps", "1", "--checkpoints_total_limit", "1",
        "--logging_steps", "1", "--save_images_steps", "none"), check=False)
    line = one_line_error(proc, 4, "training diverged:")
    assert " step " in line and "nothing was saved from non-finite weights" in line
    assert not (run / "model_index.json").exists() and not (run / "export.json").exists()
    ckpts = list_checkpoints(run)
    # rotation kept the newest finite one and the newest before the loss left its range (issue 30: it may be older)
    assert 1 <= len(ckpts) <= 2 and all(verify_checkpoint(c) is None for c in ckpts), ckpts
    for ckpt in ckpts:
        for weights in (load_file(str(ckpt / "model.safetensors")), load_ema_weights(ckpt)):
            assert all(torch.isfinite(t).all() for t in weights.values())
    step = int(line.split(" step ")[1].split()[0].strip("(),;"))
    if "resume from " in line:
        named = run / line.split("resume from ")[1].split(",")[0]
        assert named in ckpts and int(named.name.split("-")[1]) < step <= 30, line
    else:  # NaN at the first step after a checkpoint: its weights gave it, so none is named (issue 30)
        assert "restart (every checkpoint was taken after the loss left its range)" in line, line


def assert_refused_untouched(tmp_path, capsys, flags, message):
    """The flags are refused with exit 2 and one line naming `message`; no run folder is created."""
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", str(tmp_path / "run"), *flags], capsys)
    assert code == 2
    one_line_error(err, 2, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, message", [
    (["--learning_rate", "inf"], "--learning_rate must be a finite number"),
    (["--max_train_minutes", "nan"], "--max_train_minutes must be a finite number"),
    (["--lr_warmup_steps", "-5"], "--lr_warmup_steps must be >= 0"),
    (["--max_resident_gb", "0"], "--max_resident_gb must be > 0"),  # issue 56: 0 would stream even a tiny set
    (["--max_resident_gb", "-1"], "--max_resident_gb must be > 0"),
])
def test_2_non_finite_or_negative_settings_are_refused(tmp_path, capsys, flags, message):
    assert_refused_untouched(tmp_path, capsys, flags, message)


def test_3_an_empty_output_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", ""], capsys)
    assert code == 2
    one_line_error(err, 2, "--output_dir must name a folder")
    assert list(tmp_path.iterdir()) == []


def test_4_the_output_folder_lock_names_its_holder_and_dies_with_it(tmp_path):
    held = lock_output_dir(tmp_path, print)
    with pytest.raises(ConfigError, match=f"in use by another training process \\(PID {os.getpid()}\\)"):
        lock_output_dir(tmp_path, print)
    held.close()
    lock_output_dir(tmp_path, print).close()  # released with its holder
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from adaptive.rundir import lock_output_dir; "
                               f"h = lock_output_dir({str(tmp_path)!r}, print); print('held', flush=True); "
                               "time.sleep(600)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"PID {holder.pid}"):
        lock_output_dir(tmp_path, print)
    holder.kill()  # a crash: the OS releases the lock, nothing stale is left
    holder.wait()
    lock_output_dir(tmp_path, print).close()


@pytest.mark.slow
def test_4_a_second_process_on_the_same_folder_is_refused_while_the_first_trains(tmp_path, image_folder):
    from test_resume import last_step, start, wait_for

    run = tmp_path / "run"
    args = tiny_args(image_folder, run, "--max_train_steps", "100000", "--checkpointing_steps", "100000",
                     "--logging_steps", "1", "--save_images_steps", "none", "--resume_from_checkpoint", "latest")
    first = start(args)
    try:
        wait_for(lambda: last_step(run) >= 1, timeout=300, proc=first)
        second = run_cli("train_accelerate.py", args, check=False)
        one_line_error(second, 2, f"is in use by another training process (PID {first.pid})")
        seen = last_step(run)
        wait_for(lambda: last_step(run) >= seen + 1, timeout=300, proc=first)  # the first trains on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "stats.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # exactly one writer: no duplicate or missing rows


@pytest.mark.slow
def test_5_resume_latest_refuses_when_every_checkpoint_is_broken(trained, tmp_path, capsys):
    run, args = fresh(trained, tmp_path)
    (run / "checkpoint-2" / MANIFEST).unlink()
    model = run / "checkpoint-1" / "model.safetensors"
    model.write_bytes(b"\0" * model.stat().st_size)
    before = snapshot(run)
    code, err = cli([*args, "--max_train_steps", "4", "--resume_from_checkpoint", "latest"], capsys)
    assert code == 2
    line = one_line_error(err, 2, "--resume_from_checkpoint latest: no valid checkpoint in")
    assert "checkpoint-2: no manifest.json" in line and "checkpoint-1: model.safetensors is corrupt" in line
    assert "--overwrite_output_dir" in line
    assert snapshot(run) == before  # stats.jsonl and everything else untouched


# ---------------------------------------------------------------------------------------------- hangs


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_7_a_stopped_or_dead_rank_ends_the_launch_within_the_ddp_timeout(tmp_path, image_folder, fault):
    from test_resume import last_step, wait_for

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    args = tiny_args(image_folder, run, "--max_train_steps", "100000", "--checkpointing_steps", "100000",
                     "--logging_steps", "1", "--save_images_steps", "none", "--ddp_timeout_minutes", "0.2")
    launcher = subprocess.Popen([ACCELERATE, "launch",
                                 "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
                                 "--num_processes", "2", "train_accelerate.py", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks = {}
    try:
        wait_for(lambda: last_step(run) >= 2, timeout=300, proc=launcher)
        ranks = rank_pids(launcher)
        t0 = time.time()
        os.kill(ranks[1], getattr(signal, fault))
        out, _ = launcher.communicate(timeout=240)
        took = time.time() - t0
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    # 12 s of --ddp_timeout_minutes for the stopped rank (+ torchrun's 30 s grace to kill it), not the hour of old
    assert took < (120 if fault == "SIGSTOP" else 60), (took, out[-3000:])


@pytest.mark.slow
def test_8_sigterm_during_start_up_or_the_final_export_stops_cleanly(tmp_path, image_folder):
    from test_resume import start, wait_for

    run = tmp_path / "startup"
    proc = start(tiny_args(image_folder, run, "--max_train_steps", "5", "--save_images_steps", "none"))
    lines = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or "data:" in lines[-1], proc=proc)  # before the model
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "stopping after step 1: received SIGTERM" in out and (run / "checkpoint-1").is_dir()
    assert not (run / "model_index.json").exists()  # preempted: the checkpoint, no export

    run = tmp_path / "export"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.slow_export_train", "10",
                             *tiny_args(image_folder, run, "--max_train_steps", "2", "--save_images_steps", "none")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or "EXPORTING" in lines[-1], timeout=300, proc=proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert json.loads((run / "export.json").read_text())["step"] == 2  # the export finished


# ---------------------------------------------------------------------------------------------- issue 30: overwrite


def fake_run(folder: Path) -> dict:
    """A folder that holds a run (its config.json) and a user's file; its snapshot."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    return snapshot(folder)


@pytest.mark.parametrize("logging_dir", [".", "", "./", "logs/.."])
def test_30_1_a_logging_dir_that_is_the_output_folder_is_refused(tmp_path, capsys, logging_dir):
    run = tmp_path / "run"
    before = fake_run(run)
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", str(run), "--overwrite_output_dir", "--logging_dir",
                     logging_dir], capsys)
    assert code == 2
    one_line_error(err, 2, "is the output folder itself")
    assert snapshot(run) == before


def test_30_4_a_folder_that_is_not_a_run_is_refused_naming_its_files(tmp_path, capsys, monkeypatch):
    (tmp_path / "README.md").write_text("my project")
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "mine.txt").write_text("mine")
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", ".", "--train_data_dir", "nowhere"], capsys)
    assert code == 2
    line = one_line_error(err, 2, "is not a run folder and holds files")
    assert "README.md" in line and "unet" in line and "--overwrite_output_dir" in line
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_30_4_overwrite_in_a_folder_that_is_not_a_run_touches_only_run_files(tmp_path, image_folder):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    (out / "data" / "a.txt").write_text("mine too")
    run_cli("train_accelerate.py", tiny_args(image_folder, out, "--overwrite_output_dir", "--max_train_steps", "1",
                                             "--save_images_steps", "none"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "data" / "a.txt").read_text() == "mine too"
    assert (out / "checkpoint-1").is_dir() and not (out / ".replaced-run").exists()


@pytest.mark.slow
def test_57_a_damaged_local_export_is_a_local_error_naming_a_checkpoint_to_sample(trained, tmp_path):
    run, _ = fresh(trained, tmp_path)
    weights = next((run / "unet").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    proc = run_cli("sample.py", ["--model_path", str(run), "--output_dir", str(tmp_path / "s"), "--num_images", "1"],
                   check=False)
    line = one_line_error(proc, 2, f"--model_path {run}: its exported pipeline does not load")
    assert "Hub" not in line and f"--model_path {run / 'checkpoint-2'}" in line, line


def replaced_run(trained, tmp_path) -> tuple[Path, list[str], dict]:
    """A copy of the finished run with a marker file among its samples, its arguments and its snapshot."""
    run, args = fresh(trained, tmp_path)
    (run / "samples").mkdir(exist_ok=True)
    (run / "samples" / "old_run_marker.png").write_bytes(b"old")
    return run, args, snapshot(run)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_30_3_a_failure_before_the_first_checkpoint_keeps_the_replaced_run(trained, tmp_path, mode):
    run, args, before = replaced_run(trained, tmp_path)
    new = [*args, "--overwrite_output_dir", "--max_train_steps", "3", "--checkpointing_steps", "3"]
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.fail_at_step", mode, "2", *new], cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    if mode == "raise":  # put back by the failing process itself
        assert snapshot(run) == before, proc.stderr[-3000:]
    else:  # killed with the old run aside: the next start puts it back (a finished run: nothing to train)
        assert (run / ".replaced-run").is_dir()
        # meanwhile sample.py says where the previous run is and what restores it (issue 57), touching nothing
        aside = run / ".replaced-run"
        sampled = run_cli("sample.py", ["--model_path", str(run), "--output_dir", str(tmp_path / "s"),
                                        "--num_images", "1"], check=False)
        assert sampled.returncode == 2 and f"whole in {aside} - sample it with --model_path {aside}" in \
            sampled.stderr and "--resume_from_checkpoint latest) puts it back first" in sampled.stderr, sampled.stderr
        assert (aside / "model_index.json").is_file()  # what the message says: a pipeline folder
        done = run_cli("train_accelerate.py", [*args, "--resume_from_checkpoint", "latest"])
        assert "restored the run" in done.stdout and "nothing to train" in done.stdout, done.stdout[-3000:]
        assert snapshot(run) == before


@pytest.mark.slow
def test_30_2_a_signal_before_the_first_checkpoint_keeps_the_replaced_run(trained, tmp_path):
    from test_resume import start, wait_for

    run, args, before = replaced_run(trained, tmp_path)
    proc = start([*args, "--overwrite_output_dir", "--max_train_steps", "5", "--checkpointing_steps", "5"])
    lines = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or "data:" in lines[-1], proc=proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "no checkpoint written" in out, out[-3000:]
    assert snapshot(run) == before


@pytest.mark.slow
def test_30_2_the_replaced_run_goes_once_the_new_one_has_its_first_checkpoint(trained, tmp_path):
    run, args, _ = replaced_run(trained, tmp_path)
    run_cli("train_accelerate.py", [*args, "--overwrite_output_dir", "--max_train_steps", "1"])
    assert not (run / ".replaced-run").exists() and not (run / "samples" / "old_run_marker.png").exists()
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-1"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["inside", "outside"])
def test_30_5_resuming_an_older_checkpoint_moves_the_newer_timeline_aside(trained, tmp_path, where):
    """Issue 57: a copy of the checkpoint kept outside the run (bk/checkpoint-1, or renamed) branches the run as one
    of its own does: one timeline, the newer one kept aside, never overwritten."""
    run, args = fresh(trained, tmp_path)  # checkpoint-1, checkpoint-2, the export of step 2
    old_rows = [l for l in (run / "stats.jsonl").read_text().splitlines() if json.loads(l)["step"] > 1]
    old_weights = (run / "checkpoint-2" / "model.safetensors").read_bytes()
    start = run / "checkpoint-1"
    if where == "outside":
        start = tmp_path / "bk" / "kept-copy"
        shutil.copytree(run / "checkpoint-1", start)
    proc = run_cli("train_accelerate.py", [*args, "--resume_from_checkpoint", str(start), "--learning_rate", "1e-3"])
    assert "not the newest" in proc.stdout and "moved aside" in proc.stdout, proc.stdout[-3000:]
    aside = run / "abandoned-after-1"
    assert (aside / "checkpoint-2" / "model.safetensors").read_bytes() == old_weights
    assert json.loads((aside / "export.json").read_text())["step"] == 2
    assert (aside / "stats.jsonl").read_text().splitlines() == old_rows
    steps = [json.loads(l)["step"] for l in (run / "stats.jsonl").read_text().splitlines() if '"lr"' in l]
    assert steps == sorted(set(steps)), steps  # one timeline: every log step once
    assert (run / "checkpoint-2" / "model.safetensors").read_bytes() != old_weights  # the new branch's, with its lr


@pytest.mark.slow
def test_56_tensorboard_shows_each_step_once_after_resuming_an_older_checkpoint(tmp_path, image_folder):
    """The first process logged steps 1-4; resumed from checkpoint-2, TensorBoard shows 1-4 once each (the second
    writer's purge_step hides the first one's steps 3-4), not 1-4 and 3-4 again."""
    from adaptive.timesteps.report import heatmap_rows

    run = tmp_path / "run"
    args = tiny_args(image_folder, run, "--logger", "tensorboard", "--logging_steps", "1", "--checkpointing_steps", "2",
                     "--save_images_steps", "none", "--max_train_steps", "4", "--timestep_sampler", "adaptive",
                     "--adaptive_warmup_steps", "1")
    run_cli("train_accelerate.py", args)
    assert tensorboard_steps(run / "logs", "loss") == [1, 2, 3, 4]
    run_cli("train_accelerate.py", [*args, "--resume_from_checkpoint", str(run / "checkpoint-2")])
    assert sorted(tensorboard_steps(run / "logs", "loss")) == [1, 2, 3, 4]
    # issue 56: the per-bin signals are one histogram over t each, not a scalar chart per bin; the heat-map's rows
    # are the whole run across the resume, each step once
    tags = tensorboard_tags(run / "logs")
    assert {"timesteps/loss_by_t", "timesteps/p_by_t"} <= tags["histograms"], tags
    assert not [t for t in tags["scalars"] if t.startswith("timesteps/") and t.rsplit("_", 1)[-1].isdigit()], tags
    assert [s for s, _ in heatmap_rows(run / "stats.jsonl")] == [1, 2, 3, 4]


def tensorboard_tags(logs: Path) -> dict[str, set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: dict[str, set[str]] = {"scalars": set(), "histograms": set()}
    for folder in sorted({p.parent for p in logs.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder))
        acc.Reload()
        for kind in tags:
            tags[kind] |= set(acc.Tags().get(kind, []))
    return tags


def tensorboard_steps(logs: Path, tag: str) -> list[int]:
    """The steps TensorBoard shows for `tag` (its loader applies the writers' purge_step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for folder in sorted({p.parent for p in logs.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder))
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            found += [e.step for e in acc.Scalars(tag)]
    return found


# ---------------------------------------------------------------------------------------------- issue 30: divergence


def max_abs_weight(ckpt: Path) -> float:
    return max(t.abs().max().item() for t in load_file(str(ckpt / "model.safetensors")).values())


def test_30_6_the_loss_range_guard_fires_on_a_blow_up_only():
    from adaptive.session import LossRange

    healthy = LossRange()  # large early losses falling, with noise: never out of range
    for step, loss in enumerate([1.0, 0.9, 0.95, 0.6, 0.4, 0.5, 0.2, 0.3, 0.1, 0.25, 0.08, 0.12, 0.05, 0.2], 1):
        assert healthy.observe(step, loss) is None and healthy.protected() == step - 1
    blown = LossRange()
    for step, loss in enumerate([1.0, 0.8, 0.7, 0.6, 0.5, 0.45, 5e3, 2e4, 1e9, float("nan")], 1):
        blown.observe(step, loss)
        if step >= 7:
            assert blown.protected() == 5 and blown.left_at == 7, step  # the window of step 6 vouched for step 5


@pytest.mark.slow
def test_30_6_a_finite_blow_up_never_rotates_out_the_last_checkpoint_before_it(tmp_path, image_folder):
    run = tmp_path / "run"
    common = ["--checkpointing_steps", "1", "--checkpoints_total_limit", "1", "--logging_steps", "1",
              "--save_images_steps", "none", "--lr_warmup_steps", "0"]
    run_cli("train_accelerate.py", tiny_args(image_folder, run, *common, "--learning_rate", "1e-3",
                                             "--max_train_steps", "8"))
    assert [c.name for c in list_checkpoints(run)] == ["checkpoint-8"]
    healthy = max_abs_weight(run / "checkpoint-8")
    proc = run_cli("train_accelerate.py", tiny_args(
        image_folder, run, *common, "--learning_rate", "1e6", "--max_grad_norm", "1", "--max_train_steps", "14",
        "--resume_from_checkpoint", "latest"), check=False)
    assert proc.returncode in (0, 4), proc.stderr[-3000:]
    if proc.returncode == 4:  # the blow-up reached inf / NaN: the line names the last checkpoint before it
        assert "resume from checkpoint-8, the newest checkpoint before the loss left its range" in proc.stderr
    else:
        assert "the loss left its running range at step 10" in proc.stdout, proc.stdout[-3000:]
    ckpts = list_checkpoints(run)
    assert run / "checkpoint-8" in ckpts and verify_checkpoint(run / "checkpoint-8") is None, ckpts
    assert max_abs_weight(run / "checkpoint-8") == healthy and max_abs_weight(ckpts[-1]) > 1e3 * healthy


@pytest.mark.slow
def test_57_a_blow_up_under_limit_1_then_latest_ends_with_a_healthy_checkpoint_and_one_timeline(tmp_path,
                                                                                                 image_folder):
    """Issue 57, the probe's scenario scaled down: a healthy run, resumed with a learning rate that blows it up
    (clipped: finite) under --checkpoints_total_limit 1 and a log window of 2; then `latest` with a sane lr, as the
    docs advise. No checkpoint written or taken after the loss left its range is `latest`; the healthy one survives
    both runs; the rerun resumes it, says so, and leaves one timeline."""
    run = tmp_path / "run"
    common = ["--checkpointing_steps", "2", "--checkpoints_total_limit", "1", "--logging_steps", "2",
              "--save_images_steps", "none", "--lr_warmup_steps", "0"]
    run_cli("train_accelerate.py", tiny_args(image_folder, run, *common, "--learning_rate", "1e-3",
                                             "--max_train_steps", "8"))
    healthy = max_abs_weight(run / "checkpoint-8")
    blown = run_cli("train_accelerate.py", tiny_args(
        image_folder, run, *common, "--learning_rate", "0.3", "--max_grad_norm", "1", "--max_train_steps", "16",
        "--resume_from_checkpoint", "latest"), check=False)
    assert blown.returncode in (0, 4), blown.stderr[-3000:]
    assert max_abs_weight(run / "checkpoint-8") == healthy  # kept through the excursion
    later = [c for c in list_checkpoints(run) if c.name != "checkpoint-8"]
    assert later and all((c / "loss_out_of_range.json").exists() for c in later), later
    if blown.returncode == 4:
        assert "resume from checkpoint-8" in blown.stderr, blown.stderr[-2000:]
    rerun = run_cli("train_accelerate.py", tiny_args(image_folder, run, *common, "--learning_rate", "1e-3",
                                                     "--max_train_steps", "16", "--resume_from_checkpoint", "latest"))
    assert "skipping checkpoint-" in rerun.stdout + rerun.stderr and "resumed from" in rerun.stdout
    assert f"{run / 'checkpoint-8'} at step 8" in rerun.stdout, rerun.stdout[-3000:]
    assert [c.name for c in list_checkpoints(run)] == ["checkpoint-16"]
    assert not (run / "checkpoint-16" / "loss_out_of_range.json").exists()
    assert max_abs_weight(run / "checkpoint-16") < 1e3 * healthy
    steps = [json.loads(l)["step"] for l in (run / "stats.jsonl").read_text().splitlines() if '"lr"' in l]
    assert steps == sorted(set(steps)), steps  # one timeline
    assert any(p.name.startswith("abandoned-after-8") for p in run.iterdir())  # the excursion kept aside


@pytest.mark.slow
def test_30_6_a_healthy_run_with_large_early_losses_never_trips_the_guard(tmp_path, image_folder):
    run = tmp_path / "run"
    # --norm_num_groups 32: one channel per group at the first level (the v1-v3 protocol model), whose early losses
    # are large and fall by more than 5x in a few steps - the case the guard must not mistake for a blow-up
    proc = run_cli("train_accelerate.py", tiny_args(
        image_folder, run, "--checkpointing_steps", "1", "--checkpoints_total_limit", "1", "--logging_steps", "1",
        "--save_images_steps", "none", "--lr_warmup_steps", "0", "--learning_rate", "2e-3", "--max_train_steps", "15",
        "--norm_num_groups", "32"))
    losses = [json.loads(l)["loss"] for l in (run / "stats.jsonl").read_text().splitlines() if '"lr"' in l]
    assert max(losses[:3]) > 5 * min(losses), losses  # large early losses, falling
    assert "left its running range" not in proc.stdout
    assert [c.name for c in list_checkpoints(run)] == ["checkpoint-15"]  # the limit holds once vouched for


# ---------------------------------------------------------------------------------------------- issue 30: one line


def test_30_9_resume_from_checkpoint_none_starts_without_resuming(tmp_path, capsys):
    from train_accelerate import main

    code = main(["--preset", "cpu-tiny16", "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "none",
                 "--print_config"])
    assert code == 0 and json.loads(capsys.readouterr().out)["resume_from_checkpoint"] is None


def test_30_9_an_output_path_name_over_255_bytes_is_one_line(tmp_path, capsys):
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", str(tmp_path / ("x" * 300) / "run")], capsys)
    assert code == 2
    one_line_error(err, 2, "over the file system's 255")
    assert list(tmp_path.iterdir()) == []


def cli_of(module_name: str, argv, capsys) -> tuple[int, str]:
    import importlib

    code = importlib.import_module(module_name).main(argv)
    return code, capsys.readouterr().err


def test_30_9_sample_and_evaluate_refuse_an_output_of_the_wrong_kind(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    for argv, message in [(["--model_path", "m", "--output_dir", str(a_file)], "exists and is not a folder"),
                          (["--model_path", "m", "--output_dir", str(a_file / "out")], "is a file, not a folder")]:
        code, err = cli_of("sample", argv, capsys)
        assert code == 2
        one_line_error(err, 2, message)
    code, err = cli_of("evaluate_fid", ["--samples", str(tmp_path), "--output", str(tmp_path)], capsys)
    assert code == 2
    one_line_error(err, 2, "--output")
    assert a_file.read_text() == "mine"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a /proc file system")
def test_57_an_output_path_where_nothing_can_be_created_is_one_line_even_for_root(tmp_path, capsys):
    """/proc passes every permission check for root, yet nothing can be created there: the check tries."""
    code, err = cli_of("sample", ["--model_path", "m", "--output_dir", "/proc/xyz"], capsys)
    assert code == 2
    one_line_error(err, 2, "/proc")
    code, err = cli_of("evaluate_fid", ["--samples", str(tmp_path), "--output", "/proc/x.json"], capsys)
    assert code == 2
    one_line_error(err, 2, "/proc")
    from adaptive.faults import check_output_path
    check_output_path(tmp_path / "new" / "run", "--output_dir")  # a writable place passes and is left as it was
    assert list(tmp_path.iterdir()) == []


def test_30_9_evaluate_scores_two_or_three_images_without_precision_recall():
    import numpy as np

    from evaluate_fid import score

    rng = np.random.default_rng(0)
    ref_feats = rng.normal(size=(20, 2))
    ref = {"name": "r", "mu": ref_feats.mean(0), "sigma": np.cov(ref_feats, rowvar=False), "feats": ref_feats}
    for n in (2, 3):
        out = score(rng.normal(size=(n, 2)), ref, "fd")
        assert np.isfinite(out["fd"]) and out["precision"] is None \
            and "need at least 4" in out["null_reasons"]["recall"]


def test_30_9_reconstruct_ema_bad_output_config_or_snapshot_is_one_line(tmp_path, capsys):
    from adaptive.config import TrainConfig

    run = tmp_path / "run"
    (run / "ema_snapshots").mkdir(parents=True)
    snapshot_file = run / "ema_snapshots" / "step-000000002-std-0.0500.safetensors"
    snapshot_file.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{trunc")  # a truncated safetensors file
    (run / "config.json").write_text(TrainConfig().to_json())
    base = ["--run_dir", str(run), "--sigma_rel", "0.05"]
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    code, err = cli_of("reconstruct_ema", [*base, "--output_dir", str(a_file)], capsys)
    assert code == 2
    one_line_error(err, 2, "exists and is not a folder")
    code, err = cli_of("reconstruct_ema", [*base, "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2
    one_line_error(err, 2, "cannot rebuild the EMA from the snapshots")
    (run / "config.json").write_text('{"block_out_channels": 5')
    code, err = cli_of("reconstruct_ema", [*base, "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2
    one_line_error(err, 2, "config.json is not a run's config")
    assert a_file.read_text() == "mine" and not (tmp_path / "out").exists()


def test_56_reconstruct_ema_refuses_a_sigma_rel_outside_its_snapshots_unless_told_to_extrapolate(tmp_path, capsys):
    from adaptive.config import TrainConfig

    run = tmp_path / "run"
    (run / "ema_snapshots").mkdir(parents=True)
    for std in ("0.0500", "0.1000"):
        (run / "ema_snapshots" / f"step-000000002-std-{std}.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{t")
    (run / "config.json").write_text(TrainConfig().to_json())
    for values in (["0.2"], ["0.08", "0.2"], ["0.03"]):
        code, err = cli_of("reconstruct_ema", ["--run_dir", str(run), "--sigma_rel", *values], capsys)
        assert code == 2
        one_line_error(err, 2, "outside the snapshots' range 0.05-0.1")
        assert sorted(p.name for p in run.iterdir()) == ["config.json", "ema_snapshots"]  # nothing written
    code, err = cli_of("reconstruct_ema", ["--run_dir", str(run), "--sigma_rel", "0.2", "--extrapolate"], capsys)
    assert "warning: --sigma_rel 0.2 is outside the snapshots' range" in err  # then the damaged files stop it


@pytest.mark.slow
def test_30_10_latest_without_the_runs_config_json_takes_its_newest_checkpoints(trained, tmp_path, capsys,
                                                                                 image_folder):
    run, _ = fresh(trained, tmp_path)
    (run / "config.json").unlink()
    code = main_of_train(["--output_dir", str(run), "--train_data_dir", str(image_folder), "--resume_from_checkpoint",
                          "latest"])
    out, err = capsys.readouterr()
    assert code == 0 and "nothing to train" in out and "different model" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["", '{"seed": 4', "[]"])
def test_57_an_unreadable_runs_config_json_falls_back_to_its_newest_checkpoints(broken, trained, tmp_path, capsys,
                                                                                image_folder):
    """Issue 57: an empty, truncated or non-object root config.json neither blocks the resume nor resumes silently
    with defaults: the newest checkpoint's config is used, and the line says so; --config of such a file is one
    line naming it."""
    run, _ = fresh(trained, tmp_path)
    (run / "config.json").write_text(broken)
    argv = ["--output_dir", str(run), "--train_data_dir", str(image_folder), "--resume_from_checkpoint", "latest"]
    code = main_of_train(argv)
    out, err = capsys.readouterr()
    assert code == 0 and "nothing to train" in out, err
    assert "warning: " in err and "resuming with checkpoint-2's config.json instead" in err, err
    assert "Traceback" not in err
    code, err = cli(["--config", str(run / "config.json"), "--output_dir", str(tmp_path / "other")], capsys)
    assert code == 2
    one_line_error(err, 2, f"{run / 'config.json'}")


def test_57_a_runs_config_json_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A crash while config.json is written leaves the old file (written beside it, then renamed)."""
    import adaptive.rundir as rundir

    target = tmp_path / "config.json"
    target.write_text('{"seed": 1}')

    def crash(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(rundir.os, "replace", crash)
    with pytest.raises(OSError):
        rundir.write_atomic(target, '{"seed": 2, "much": "more"}')
    assert target.read_text() == '{"seed": 1}'
    monkeypatch.undo()
    rundir.write_atomic(target, '{"seed": 2}')
    assert target.read_text() == '{"seed": 2}' and not list(tmp_path.glob(".*.tmp"))


def main_of_train(argv) -> int:
    from train_accelerate import main

    return main(argv)


@pytest.mark.slow
def test_30_10_a_missing_eval_ref_dir_is_named_as_such(tmp_path, capsys, image_folder):
    from conftest import write_pooled_features

    feats = write_pooled_features(tmp_path / "feat.pt")
    code, err = cli(tiny_args(image_folder, tmp_path / "run", "--max_train_steps", "1", "--eval_steps", "1",
                              "--eval_feature_extractor", str(feats), "--eval_ref_dir", str(tmp_path / "nowhere")),
                    capsys)
    assert code == 2
    one_line_error(err, 2, f"--eval_ref_dir {tmp_path / 'nowhere'} does not exist")


def test_56_a_missing_feature_network_is_named_by_the_training_flag_before_any_data_is_decoded(tmp_path, capsys,
                                                                                              image_folder):
    missing = tmp_path / "missing.pt"
    code = main_of_train(tiny_args(image_folder, tmp_path / "run", "--max_train_steps", "1", "--eval_steps", "1",
                                   "--eval_feature_extractor", str(missing)))
    out, err = capsys.readouterr()
    assert code == 2
    one_line_error(err, 2, f"--eval_feature_extractor {missing}: the feature network does not exist")
    assert "data:" not in out and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_30_9_a_second_ctrl_c_during_an_export_stops_at_once_keeping_the_previous_export(tmp_path, image_folder):
    from test_resume import wait_for

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.interrupted_export_train", "60",
                             *tiny_args(image_folder, run, "--max_train_steps", "2", "--save_model_steps", "1",
                                        "--save_images_steps", "none")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or "EXPORTING" in lines[-1], timeout=300, proc=proc)
    before = snapshot(run)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert time.time() - t0 < 30 and proc.returncode == 130, (proc.returncode, err[-3000:])
    one_line_error(err, 130, "interrupted by a second Ctrl-C")
    assert json.loads((run / "export.json").read_text())["step"] == 1  # the previous export, whole
    exported = {k: v for k, v in snapshot(run).items() if k.split("/")[0] in ("unet", "scheduler", "model_index.json",
                                                                            "README.md", "export.json")}
    assert exported == {k: v for k, v in before.items() if k in exported} and "model_index.json" in exported
    assert not (run / ".export.tmp").exists() and not (run / ".export.old").exists()


@pytest.mark.slow
def test_30_10_sighup_stops_like_sigterm_with_a_checkpoint(tmp_path, image_folder):
    from test_resume import start, wait_for

    run = tmp_path / "run"
    proc = start(tiny_args(image_folder, run, "--max_train_steps", "5", "--save_images_steps", "none"))
    lines = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or "data:" in lines[-1], proc=proc)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "received SIGHUP" in out and (run / "checkpoint-1").is_dir()


def test_30_3_an_allocation_failure_is_one_line_exit_2(capsys, monkeypatch):
    """Issue 30, finding 3 (the drill's --train_batch_size 40000000): after the old run was put back, the allocation
    failure itself still ended in a traceback (exit 1)."""
    import adaptive.loop

    def oom(cfg, control):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 122880000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(adaptive.loop, "train", oom)
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", "runs/never-written"], capsys)
    assert code == 2, err
    line = one_line_error(err, 2, "out of memory (tried to allocate 122880000000 bytes): lower --train_batch_size")
    assert "Traceback" not in err and line.startswith("train_accelerate.py: error: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_56_a_gpu_launch_on_a_host_without_gpus_stops_every_rank_before_data_with_one_line(tmp_path, capsys,
                                                                                          monkeypatch):
    """Issue 56: an 8-GPU accelerate config on a CPU host spawned 8 processes that each decoded the data and buried
    the useful line in ~90 lines of launcher output. Each rank now stops first (exit 7, nothing decoded or written),
    and torchrun's own failure summary (read by torch's parser) shows the same line instead of 'To enable traceback'."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    import adaptive.loop

    def no_data(cfg):
        raise AssertionError("the data source was opened")

    monkeypatch.setattr(adaptive.loop, "open_entries", no_data)
    error_file = tmp_path / "error.json"
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    out = tmp_path / "run"
    code, err = cli(["--preset", "cpu-tiny16", "--output_dir", str(out)], capsys)
    assert code == 7, err
    line = one_line_error(err, 7, "launched 8 processes for GPUs, but torch sees no GPU")
    assert "cpu_2proc.yaml" in line and not out.exists()
    assert ProcessFailure(local_rank=0, pid=1, exitcode=7, error_file=str(error_file)).message == line
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # the CPU config's launch passes the check (and reaches the data)
    with pytest.raises(AssertionError, match="data source was opened"):
        cli(["--preset", "cpu-tiny16", "--output_dir", str(out)], capsys)


# ---------------------------------------------------------------------------------------------- issue 30: Hub waits


@pytest.fixture
def silent_hub():
    hub = SilentHub()
    yield hub
    hub.close()


def hub_path(tmp_path: Path, image_folder: Path, path: str) -> tuple[str, list[str]]:
    """(script, arguments) of a command that waits on the Hub for `path`: the pipeline, the data, the reference."""
    if path == "sample --model_path":
        return "sample.py", ["--model_path", "someone/ddpm", "--output_dir", str(tmp_path / "samples"),
                             "--num_images", "1"]
    if path == "train --dataset_name":
        return "train_accelerate.py", tiny_args(image_folder, tmp_path / "run", "--train_data_dir", "none",
                                                "--dataset_name", "someone/data")
    feat = write_pooled_features(tmp_path / "feat.pt")
    return "evaluate_fid.py", ["--make_ref", "--ref_dataset", "someone/data", "--feature_extractor", str(feat)]


def start_against(hub: SilentHub, tmp_path: Path, script: str, args: list[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, script, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stderr_when_done(proc: subprocess.Popen) -> tuple[float, str]:
    """(seconds until the command said its last word on stderr, all of stderr) once it has exited. The exit itself
    can take longer: the interpreter's teardown after torch + datasets, 15-20 s on a loaded 2-core machine."""
    t0, last, lines = time.monotonic(), None, []
    for line in proc.stderr:
        lines.append(line)
        last = time.monotonic() - t0
    proc.wait(timeout=120)
    return (last if last is not None else time.monotonic() - t0), "".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["sample --model_path", "train --dataset_name", "evaluate_fid --ref_dataset"])
def test_30_7_a_hub_that_never_answers_is_one_line_and_exit_2_within_seconds(silent_hub, tmp_path, image_folder,
                                                                             path):
    """Issue 30, finding 7: the pipeline, the data and the reference against a Hub that accepts and never answers
    (before: no end after 900 s, exit 2 after ~400 s)."""
    flag, repo = path.split()[1], "someone/ddpm" if path.startswith("sample") else "someone/data"
    proc = start_against(silent_hub, tmp_path, *hub_path(tmp_path, image_folder, path))
    assert silent_hub.connected.wait(300), "the command never asked the Hub"
    waited, err = stderr_when_done(proc)
    line = one_line_error(err, 2, f"{flag} {repo}: no answer from the Hub at {silent_hub.url} within 10 s")
    assert waited < 30, (waited, line)  # the 10 s wait for a first answer, and the line


@pytest.mark.slow
def test_30_7_a_sigterm_during_a_hub_wait_stops_at_once(silent_hub, tmp_path, image_folder):
    """Issue 30, finding 7: a SIGTERM while the data is awaited from a silent Hub (before: held for minutes)."""
    proc = start_against(silent_hub, tmp_path, *hub_path(tmp_path, image_folder, "train --dataset_name"))
    assert silent_hub.connected.wait(300), "the command never asked the Hub"
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    waited, err = stderr_when_done(proc)
    one_line_error(err, 128 + signal.SIGTERM, "stopped by SIGTERM while waiting for --dataset_name someone/data")
    assert waited < 5 and not (tmp_path / "run").exists(), waited


# ---------------------------------------------------------------------------------------------- leaks


@pytest.mark.parametrize("spelling", [["--hub_token", SECRET], [f"--hub_token={SECRET}"], ["--hub_t", SECRET],
                                      [f"--hub_tok={SECRET}"], ["--hub_token", ENV_SECRET]])
def test_9_no_token_spelling_reaches_the_recorded_command(spelling, monkeypatch):
    from train_accelerate import parse_args

    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    argv = ["train_accelerate.py", "--preset", "cpu-tiny16", *spelling, "--output_dir", "runs/x"]
    try:
        cfg = resolve_config(parse_args(argv[1:]))
    except SystemExit as e:  # abbreviations are refused, so they can never carry a token past the scrubber
        assert e.code == 2 and not spelling[0].startswith("--hub_token")
        return
    command = scrubbed_command(argv, run_secrets(cfg))
    assert SECRET not in command and ENV_SECRET not in command and "***" in command


def test_9_every_cli_refuses_abbreviated_flags():
    import evaluate_fid
    import reconstruct_ema
    import sample
    import train_accelerate

    for module, base, flag, abbreviated in [
            (train_accelerate, [], "--hub_token", "--hub_t"),
            (sample, ["--model_path", "m", "--output_dir", "o"], "--num_images", "--num_im"),
            (evaluate_fid, ["--samples", "s"], "--num_images", "--num_im"),
            (reconstruct_ema, ["--run_dir", "r", "--sigma_rel", "0.1"], "--at_step", "--at_st")]:
        module.parse_args([*base, flag, "3"])  # spelled out: accepted
        with pytest.raises(SystemExit) as e:
            module.parse_args([*base, abbreviated, "3"])
        assert e.value.code == 2, module.__name__


@pytest.mark.parametrize("module_name, base, typo, meant", [
    ("train_accelerate", [], "--lerning_rate", "--learning_rate"),
    ("sample", ["--model_path", "m", "--output_dir", "o"], "--num_imags", "--num_images"),
    ("evaluate_fid", ["--samples", "s"], "--feature_extracter", "--feature_extractor"),
    ("reconstruct_ema", ["--run_dir", "r", "--sigma_rel", "0.1"], "--at_stp", "--at_step")])
def test_56_a_misspelled_flag_gets_its_nearest_namesake_and_an_unknown_one_none(module_name, base, typo, meant,
                                                                                 capsys):
    import importlib

    module = importlib.import_module(module_name)
    with pytest.raises(SystemExit) as e:
        module.parse_args([*base, typo, "3"])
    assert e.value.code == 2
    one_line_error(capsys.readouterr().err, 2, f"unrecognized arguments: {typo} 3; did you mean {meant}?")
    with pytest.raises(SystemExit):
        module.parse_args([*base, "--zzzzzz", "3"])
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("module_name, base", [
    ("train_accelerate", []), ("sample", ["--model_path", "m", "--output_dir", "o"]),
    ("evaluate_fid", ["--samples", "s"]), ("reconstruct_ema", ["--run_dir", "r", "--sigma_rel", "0.1"])])
@pytest.mark.parametrize("spelling", [["--hub_t", "s3cr3t-value"], ["--hubtoken", SECRET], [f"--hub_tok={SECRET}"],
                                      ["--hub_token", SECRET], ["--api-key", "s3cr3t-value"], ["--whatever", SECRET],
                                      ["--num_images", "3", "hf_PositionalSecret42"], ["--hubkey", "s3cr3tValue"],
                                      ["--db_password=s3cr3tValue"], ["--auth", "s3cr3tValue"]])
def test_30_8_argparse_errors_never_echo_a_token(module_name, base, spelling, capsys, monkeypatch):
    """Issue 30, finding 8: a misspelled or unknown token flag is refused without its value in the error line."""
    import importlib

    module = importlib.import_module(module_name)
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    argv = [*base, *spelling, "--also_unknown", ENV_SECRET]
    if module_name == "train_accelerate" and spelling[0] == "--hub_token":
        argv = [*base, *spelling, "--num_im", ENV_SECRET]  # --hub_token is this CLI's own flag: another error
    with pytest.raises(SystemExit) as e:
        module.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err, err
    for secret in (SECRET, ENV_SECRET, "s3cr3t-value", "hf_PositionalSecret42", "s3cr3tValue"):
        assert secret not in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, hidden", [
    (["--hubkey", "s3cr3tValue"], "s3cr3tValue"), (["--hubkey=s3cr3tValue"], "s3cr3tValue"),
    (["--db-password", "pw-Value1"], "pw-Value1"), (["--my_secret", "x1"], "x1"), (["--auth_header", "Bearer-x"], "Bearer-x"),
    (["--api_key", "abc"], "abc"), (["--hub_token", SECRET], SECRET), (["--note", "ghp_abcdefghijkl123"], "ghp_abcdefghijkl123"),
    (["--note", "hf_anything"], "hf_anything")])
def test_57_one_scrubber_hides_any_secret_looking_flag_and_token_shaped_value(argv, hidden):
    """Issue 57: the value of any flag whose name holds token / key / secret / password / auth, and anything
    token-shaped, is hidden in recorded commands, rerun commands and messages - by the one scrubber every script uses;
    everything else is left as it was."""
    from adaptive.rundir import rerun_command
    from adaptive.secrets import scrub_argv, scrub_text

    full = ["train_accelerate.py", "--output_dir", "runs/key-frames", *argv, "--learning_rate", "2e-3"]
    scrubbed = scrub_argv(full)
    assert hidden not in " ".join(scrubbed) and "***" in " ".join(scrubbed)
    assert [a for a in scrubbed if "***" not in a] == [a for a in full if hidden not in a]  # nothing else touched
    assert hidden not in rerun_command(full) and "runs/key-frames" in rerun_command(full)
    message = f"error: unrecognized arguments: {' '.join(argv)} (from {' '.join(full)})"
    assert hidden not in scrub_text(message, full) and "runs/key-frames" in scrub_text(message, full)


@pytest.mark.slow
def test_9_no_token_in_any_file_of_a_run(trained):
    run, _ = trained
    info = json.loads((run / "run_info.json").read_text())
    assert "--hub_token=***" in info["command"]
    for p in run.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert SECRET.encode() not in data and ENV_SECRET.encode() not in data, p


# ---------------------------------------------------------------------------------------------- one-line errors


def can_mount_tmpfs(tmp_path: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
def test_11_disk_full_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path, image_folder):
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs here (needs unshare -rm: user and mount namespaces)")
    flags = tiny_args(image_folder, Path("unused"), "--save_images_steps", "none")
    flags = flags[:flags.index("--output_dir")] + flags[flags.index("--output_dir") + 2:]
    result = tmp_path / "result.json"
    subprocess.run(["unshare", "-rm", sys.executable, "-m", "tests.helpers.disk_full_run", "30", str(tmp_path / "mnt"),
                    str(result), "--", *flags], cwd=ROOT, check=True, timeout=900)
    r = json.loads(result.read_text())
    assert r["first_rc"] == 0, r["first_stderr"]
    line = one_line_error(r["second_stderr"], 5, "disk full: no space left on the device of")
    assert r["second_rc"] == 5
    assert "while writing checkpoint-2" in line and "checkpoint-1 is intact" in line
    assert r["after"] == r["before"]  # the previous checkpoint, byte for byte
    assert not [n for n in r["listing"] if n.startswith(".checkpoint-")]  # the partial and the stale one removed
    assert "checkpoint-2" not in r["listing"]


def test_12_manifests_of_the_wrong_shape_are_skipped_not_crashed_on(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    for manifest in ['{"files": "abc"}', '{"files": {"x": null}}', '{"files": {"../../etc/passwd": {"bytes": 1, '
                     '"sha256": "0"}}}', '[]', '{"files": {"model.safetensors": {"bytes": "1", "sha256": "0"}}}']:
        (folder / MANIFEST).write_text(manifest)
        reason = verify_checkpoint(folder)
        assert reason and "\n" not in reason and MANIFEST in reason, (manifest, reason)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors", "training_state.pt", "optimizer.bin"])
def test_12_a_truncated_file_under_a_recomputed_manifest_is_named_in_one_line(trained, tmp_path, capsys, name):
    run, args = fresh(trained, tmp_path)
    ckpt = run / "checkpoint-2"
    with open(ckpt / name, "r+b") as f:
        f.truncate((ckpt / name).stat().st_size // 2)
    write_manifest(ckpt, 2)  # sizes and hashes now match the truncated file
    assert f"{name} is unreadable" in verify_checkpoint(ckpt)
    code, err = cli([*args, "--max_train_steps", "4", "--resume_from_checkpoint", str(ckpt)], capsys)
    assert code == 2
    one_line_error(err, 2, f"is not a valid checkpoint: {name} is unreadable (truncated or damaged")


@pytest.mark.parametrize("flags, message", [
    (["--norm_num_groups", "0"], "--norm_num_groups must be >= 1"),
    (["--attention_head_dim", "0"], "--attention_head_dim must be >= 1"),
    (["--down_block_types", "Foo", "Bar", "Baz"], "the U-Net cannot be built"),
    (["--attention_head_dim", "100"], "the U-Net cannot be built"),
    (["--adam_beta1", "2"], "--adam_beta1 must be in [0, 1)"),
    (["--adam_epsilon", "-1"], "--adam_epsilon and --adam_weight_decay must be >= 0"),
])
def test_13_bad_model_and_optimizer_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    assert_refused_untouched(tmp_path, capsys, flags, message)


@pytest.mark.slow
def test_14_a_cpu_launch_without_accelerate_use_cpu_says_so_once_first(tmp_path, image_folder):
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    proc = subprocess.run([ACCELERATE, "launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
                           "train_accelerate.py", *tiny_args(image_folder, tmp_path / "run")], cwd=ROOT,
                          env={**env, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=600)
    err = proc.stderr
    message = "launched 2 processes for GPUs, but torch sees no GPU on this host"  # checked first since issue 56
    said = [line for line in err.splitlines() if line.startswith("train_accelerate.py: error: ")]
    assert proc.returncode != 0 and len(said) == 1 and message in said[0], err[-4000:]  # rank 0, once
    assert "ACCELERATE_USE_CPU=1 accelerate launch --config_file accelerate_configs/cpu_2proc.yaml" in said[0]
    first = err.index(message)
    assert first < err.find("Traceback") if "Traceback" in err else True
    ours = err[err.rfind("\n", 0, first) + 1:err.find("\n", first)]
    assert ours.startswith("train_accelerate.py: error: ") and ours.count("error:") == 1  # whole, on its own line
    assert "exitcode  : 7" in err and f"traceback : {said[0]}" in err  # the status and the line, in torchrun's report
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_15_a_changed_learning_rate_applies_from_the_resumed_step(trained, tmp_path):
    run, args = fresh(trained, tmp_path)
    proc = run_cli("train_accelerate.py", [*args, "--max_train_steps", "3", "--resume_from_checkpoint", "latest",
                                           "--learning_rate", "1e-3", "--adam_beta2", "0.99"])
    record = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines()][-1]
    assert record["step"] == 3 and record["lr"] == pytest.approx(1e-3 * 3 / 4)  # warm-up 4 steps, new peak
    groups = torch.load(run / "checkpoint-3" / "optimizer.bin", weights_only=True)["param_groups"]
    assert groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4) and tuple(groups[0]["betas"]) == (0.9, 0.99)
    assert torch.load(run / "checkpoint-3" / "scheduler.bin", weights_only=True)["base_lrs"] == [1e-3]
    assert "changed settings, which apply from its step on: adam_beta2, learning_rate, max_train_steps" in proc.stdout


@pytest.mark.slow
def test_16_reconstruct_ema_refuses_to_overwrite_the_runs_export_without_overwrite(trained, tmp_path, capsys):
    import reconstruct_ema

    run, _ = fresh(trained, tmp_path)
    before = snapshot(run)
    assert reconstruct_ema.main(["--run_dir", str(run), "--sigma_rel", "0.08", "--output_dir", str(run)]) == 2
    one_line_error(capsys.readouterr().err, 2, "is the run folder (its exported pipeline would be replaced)")
    assert snapshot(run) == before
    assert reconstruct_ema.main(["--run_dir", str(run), "--sigma_rel", "0.08"]) == 0  # run/phema-0.080: new
    assert reconstruct_ema.main(["--run_dir", str(run), "--sigma_rel", "0.08"]) == 2  # now taken
    assert "already holds a pipeline" in capsys.readouterr().err
    assert reconstruct_ema.main(["--run_dir", str(run), "--sigma_rel", "0.08", "--output_dir", str(run),
                                 "--overwrite"]) == 0
    assert snapshot(run)["unet/diffusion_pytorch_model.safetensors"] != \
        before["unet/diffusion_pytorch_model.safetensors"]


def test_an_existing_output_file_may_be_replaced_but_not_written_through(tmp_path):
    """--output of evaluate_fid.py names a file: an existing one is replaced (a rerun), a file used as a folder is
    not."""
    from adaptive.config import ConfigError
    from adaptive.faults import check_output_path

    metrics = tmp_path / "metrics.json"
    metrics.write_text("{}")
    check_output_path(metrics, "--output", folder=False)
    check_output_path(tmp_path / "new.json", "--output", folder=False)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_output_path(metrics / "x.json", "--output", folder=False)
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        check_output_path(metrics, "--output_dir")


class Hostile:  # a class the weights-only loader refuses to unpickle
    pass


def hostile_state(kind: str):
    return {"empty": {}, "wrong_types": {"progress": "step 7", "sampler": [1, 2], "ema": None},
            "refused": {"progress": Hostile()}}[kind]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["state:empty", "state:wrong_types", "state:refused", "config:[]",
                                    "config:{\"seed\": \"x\"}", "stats:rows"])
def test_57_hostile_checkpoint_contents_are_one_line_naming_the_file(target, trained, tmp_path, capsys):
    """Issue 57: a checkpoint whose files pass the manifest (re-written over the hostile contents) but hold the
    wrong things - training_state.pt of {}, of wrong types, or refused by the weights-only loader; a checkpoint
    config.json of the wrong shape; stats.jsonl rows of the wrong shape - is refused in one line naming the file,
    with the run untouched; never a traceback."""
    run, args = fresh(trained, tmp_path)
    ckpt = run / "checkpoint-2"
    what, _, kind = target.partition(":")
    if what == "state":
        torch.save(hostile_state(kind), ckpt / "training_state.pt")
        named = "training_state.pt"
    elif what == "config":
        (ckpt / "config.json").write_text(kind)
        (run / "config.json").unlink()  # so that the checkpoint's config is the one resumed
        named = "config.json"
    else:
        with open(run / "stats.jsonl", "a") as f:
            f.write('[1, 2]\n{"step": "seven", "loss": 1}\n')
        named = "stats.jsonl"
    write_manifest(ckpt, 2)
    before = snapshot(run)
    code = main_of_train([*args, "--max_train_steps", "4", "--resume_from_checkpoint", str(ckpt)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err[-3000:]
    if what == "stats":  # rows that are not a step's record are dropped, saying so; the run goes on
        assert code == 0 and "stats.jsonl: skipped 2 line(s)" in out, err[-2000:]
        rows = [json.loads(l) for l in (run / "stats.jsonl").read_text().splitlines()]
        assert all(isinstance(r, dict) and isinstance(r["step"], int) for r in rows)
        return
    assert code == 2, err[-2000:]
    line = one_line_error(err, 2, named)
    assert str(ckpt.name) in line or what == "stats", line
    assert snapshot(run) == before


class ScalarFeatures(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean()


def test_57_a_feature_network_that_returns_no_feature_vectors_is_one_line(tmp_path, capsys):
    import warnings

    import numpy as np
    from PIL import Image

    path = tmp_path / "scalar.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
        torch.jit.script(ScalarFeatures()).save(str(path))
    samples = tmp_path / "samples"
    samples.mkdir()
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(samples / f"{i}.png")
    code, err = cli_of("evaluate_fid", ["--samples", str(samples), "--feature_extractor", str(path),
                                        "--ref_dir", str(samples), "--num_images", "3",
                                        "--output", str(tmp_path / "fid.json")], capsys)
    assert code == 2
    one_line_error(err, 2, "returned () for 3 images")
