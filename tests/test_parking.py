"""Runs that outlive their machine. benchmarks/park_runs.py: a parked run keeps exactly its newest checkpoint that
verifies, a run is stopped through its preemption path (and the benchmark that started it first), and nothing is
deleted when a run cannot be parked. benchmarks/same_run.py: a resumed run's log equals the original's, a divergence
is found. A finished run is not parked, and a copy an earlier park staged leaves git's index."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from adaptive.checkpoint import write_manifest
from benchmarks.park_runs import main as park
from benchmarks.same_run import main as same_run
from conftest import ROOT


def make_checkpoint(run: Path, step: int, corrupt: bool = False) -> Path:
    """A small checkpoint folder that verify_checkpoint accepts (or, `corrupt`, one whose weights fail sha256)."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((4,), float(step))}, str(folder / "model.safetensors"))
    torch.save({"step": step}, folder / "training_state.pt")
    (folder / "config.json").write_text(json.dumps({"seed": 0}))
    write_manifest(folder, step)
    if corrupt:
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (folder / "model.safetensors").write_bytes(bytes(data))
    return folder


def make_run(run: Path, steps: list[int], corrupt: tuple[int, ...] = ()) -> Path:
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "stats.jsonl").write_text(json.dumps({"step": max(steps, default=0)}) + "\n")
    for s in steps:
        make_checkpoint(run, s, corrupt=s in corrupt)
    return run


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in run.glob("checkpoint-*"))


def test_parking_keeps_only_the_newest_checkpoint_that_verifies(tmp_path):
    run = make_run(tmp_path / "work" / "adaptive_seed0", [250, 500, 750], corrupt=(750,))
    other = make_run(tmp_path / "work" / "uniform_seed0", [500])
    assert park([str(tmp_path / "work"), "--no_stage"]) == 0
    assert checkpoints(run) == ["checkpoint-500"]  # 750 fails its sha256: the run resumes from 500 either way
    assert checkpoints(other) == ["checkpoint-500"]


def test_a_run_without_a_valid_checkpoint_stops_everything_before_any_deletion(tmp_path, capsys):
    good = make_run(tmp_path / "work" / "a_seed0", [250, 500])
    broken = make_run(tmp_path / "work" / "b_seed0", [250], corrupt=(250,))
    assert park([str(tmp_path / "work"), "--no_stage"]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint that verifies" in err and str(broken) in err and len(err.strip().splitlines()) == 1
    assert checkpoints(good) == ["checkpoint-250", "checkpoint-500"]


def test_a_folder_without_checkpoints_is_left_alone_and_the_others_are_parked(tmp_path, capsys):
    restored = make_run(tmp_path / "work" / "adaptive_seed10", [])  # a finished run's records, restored from OUT/runs
    run = make_run(tmp_path / "work" / "min_snr_seed10", [5000, 5266])
    assert park([str(tmp_path / "work"), "--no_stage"]) == 0
    assert f"{restored}: no checkpoint" in capsys.readouterr().out
    assert checkpoints(run) == ["checkpoint-5266"] and (restored / "stats.jsonl").is_file()


def test_dry_run_and_bad_paths_change_nothing(tmp_path, capsys):
    run = make_run(tmp_path / "run", [250, 500])
    assert park([str(run), "--dry_run"]) == 0
    assert checkpoints(run) == ["checkpoint-250", "checkpoint-500"]
    assert park([str(tmp_path / "missing")]) == 2
    assert park([str(tmp_path), "--no_stage"]) == 0  # tmp_path holds one run: "run"
    (tmp_path / "empty").mkdir()
    assert park([str(tmp_path / "empty")]) == 2
    assert "no training run" in capsys.readouterr().err


# A stand-in training process: holds the run's lock like train_accelerate.py, and on SIGTERM writes a checkpoint
# (as the preemption path does) before exiting; its parent is named compare_methods.py like the benchmark driver.
TRAINER = textwrap.dedent("""
    import fcntl, signal, sys, time
    from test_parking import make_checkpoint  # run in tests/ (python -c puts the working folder first)
    from pathlib import Path
    run = Path({run!r})
    lock = open(run / ".lock", "a")
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    (run / "ready").write_text("")
    while not stop:
        time.sleep(0.05)
    time.sleep(1.0)  # an evaluation in progress finishes first
    make_checkpoint(run, 900)
""")
DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", {trainer!r}])
    open({pid_file!r}, "w").write(str(child.pid))
    time.sleep(600)
""")


def test_running_runs_are_stopped_through_their_preemption_path_and_their_driver_first(tmp_path):
    run = make_run(tmp_path / "work" / "adaptive_seed0", [250, 500])
    driver_py = tmp_path / "compare_methods.py"
    driver_py.write_text(DRIVER.format(trainer=TRAINER.format(run=str(run)),
                                       pid_file=str(tmp_path / "trainer.pid")))
    driver = subprocess.Popen([sys.executable, str(driver_py)], cwd=ROOT / "tests")
    try:
        deadline = time.monotonic() + 60
        while not (run / "ready").exists():
            assert time.monotonic() < deadline and driver.poll() is None, "the stand-in trainer did not start"
            time.sleep(0.1)
        (run / "ready").unlink()
        assert park([str(run), "--no_stop", "--no_stage"]) == 2  # still training: refused, nothing touched
        assert checkpoints(run) == ["checkpoint-250", "checkpoint-500"]
        assert park([str(run), "--no_stage", "--timeout", "60"]) == 0
        assert driver.wait(timeout=10) != 0  # the driver got SIGTERM (it would otherwise sleep for 600 s)
        assert checkpoints(run) == ["checkpoint-900"]  # written on SIGTERM, after park_runs asked
    finally:
        driver.kill()
    with open(run / ".lock") as f:  # the lock is free again
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_driver_is_found_by_path_and_as_a_module():
    from benchmarks.park_runs import is_benchmark_driver

    assert is_benchmark_driver([b"python", b"benchmarks/compare_methods.py", b"--claim"])
    assert is_benchmark_driver([b"/venv/bin/python", b"-m", b"benchmarks.compare_methods", b"--claim"])
    assert not is_benchmark_driver([b"python", b"-m", b"benchmarks.park_runs", b"benchmarks/compare_methods"])
    assert not is_benchmark_driver([b"python", b"train_accelerate.py", b"--output_dir", b"x"])


def test_staging_adds_the_ignored_run_folder_but_not_its_lock(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout  # noqa
    git("init", "-q")
    (repo / ".gitignore").write_text("_work/\n")
    run = make_run(repo / "_work" / "run_seed0", [250, 500])
    (run / ".lock").write_text("")
    assert park([str(run)]) == 0
    staged = git("diff", "--cached", "--name-only").split()
    assert "_work/run_seed0/checkpoint-500/model.safetensors" in staged and "_work/run_seed0/stats.jsonl" in staged
    assert not any("checkpoint-250" in s or s.endswith(".lock") for s in staged)


def test_a_finished_run_is_not_parked_and_its_earlier_parked_copy_leaves_the_index(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout  # noqa
    git("init", "-q")
    (repo / ".gitignore").write_text("_work/\n")
    done = make_run(repo / "_work" / "adaptive_seed10", [4000])
    going = make_run(repo / "_work" / "uniform_seed10", [4250])
    assert park([str(repo / "_work")]) == 0  # the earlier park: both runs unfinished
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "park")
    make_checkpoint(done, 6000)  # then both train on; one finishes and exports its pipeline of step 6000
    (done / "export.json").write_text(json.dumps({"step": 6000, "metrics": {}}))
    make_checkpoint(going, 5000)
    capsys.readouterr()
    assert park([str(repo / "_work"), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert f"{done}: finished at step 6000" in out and "would take its earlier parked copy out" in out
    assert git("diff", "--cached", "--name-only") == "" and checkpoints(done) == ["checkpoint-4000", "checkpoint-6000"]
    assert park([str(repo / "_work")]) == 0
    assert checkpoints(done) == ["checkpoint-4000", "checkpoint-6000"]  # a finished run: nothing pruned
    assert checkpoints(going) == ["checkpoint-5000"]
    tracked = git("ls-files", "--cached").split()
    assert not any(t.startswith("_work/adaptive_seed10/") for t in tracked)  # out of the index...
    assert (done / "checkpoint-4000" / "model.safetensors").is_file()  # ...and still on disk
    assert "_work/uniform_seed10/checkpoint-5000/model.safetensors" in tracked
    assert not any("checkpoint-4250" in t for t in tracked)
    (done / "export.json").write_text(json.dumps({"step": 4000, "metrics": {}}))  # exported before its newest step:
    assert park([str(done), "--no_stage"]) == 0  # not finished, so parked as usual
    assert checkpoints(done) == ["checkpoint-6000"]


def write_stats(path: Path, losses: list[float], fds: dict[int, float], seconds: float = 0.0) -> Path:
    """A stats.jsonl: a training record every 25 steps (loss, lr, wall-clock) and evaluations at the given steps."""
    rows = []
    for i, loss in enumerate(losses, 1):
        rows.append({"step": 25 * i, "loss": loss, "grad_norm": loss / 2, "lr": 1e-3, "train_seconds": seconds + i})
        if 25 * i in fds:
            rows.append({"step": 25 * i, "proxy_fd": fds[25 * i], "train_seconds": seconds + i, "eval_seconds": 9.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_same_run_accepts_a_resume_inside_a_log_window_and_finds_a_divergence(tmp_path, capsys):
    losses, fds = [0.9, 0.5, 0.4, 0.35, 0.3], {50: 12.0, 125: 11.0}
    old = write_stats(tmp_path / "old.jsonl", losses, fds)
    assert same_run([str(old), str(write_stats(tmp_path / "same.jsonl", losses, fds, seconds=100.0))]) == 0
    resumed = write_stats(tmp_path / "resumed.jsonl", [0.9, 0.5, 0.41, 0.35, 0.3], fds)  # window of step 75 cut
    assert same_run([str(old), str(resumed)]) == 0
    assert "window means differ at step 75 only" in capsys.readouterr().out
    diverged = write_stats(tmp_path / "diverged.jsonl", [0.9, 0.5, 0.41, 0.36, 0.3], fds)
    assert same_run([str(old), str(diverged)]) == 1
    assert "step 75: grad_norm" in capsys.readouterr().out
    other_fd = write_stats(tmp_path / "fd.jsonl", losses, {50: 12.0, 125: 11.5})
    assert same_run([str(old), str(other_fd)]) == 1
    assert "evaluation at step 125: proxy_fd = 11.0 vs 11.5" in capsys.readouterr().out
    last_cut = write_stats(tmp_path / "last.jsonl", [0.9, 0.5, 0.4, 0.35, 0.31], fds)  # nothing after it to agree
    assert same_run([str(old), str(last_cut)]) == 1
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert same_run([str(old), str(tmp_path / "bad.jsonl")]) == 2


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
