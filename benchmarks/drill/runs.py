"""Issue 30's run-folder faults: --overwrite_output_dir under signals and failures, folders that are not runs, branches
of a resumed older checkpoint, a finite blow-up, SIGHUP and a second Ctrl-C, and the DDP faults (a rank killed or
stopped)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .harness import LIMIT, ROOT, SECRET, Drill, finish_split, last_step, one_line, rank_pids, snapshot, wait_for_line

OVERWRITE = "overwrite x signals/failures"


def copy_of(d: Drill, finished: Path, name: str) -> tuple[Path, dict]:
    """A copy of the finished run (with a marker among its samples) and its snapshot."""
    run = d.work / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(finished, run)
    (run / "samples").mkdir(exist_ok=True)
    (run / "samples" / "old_run_marker.png").write_bytes(b"old")
    return run, snapshot(run)


def overwrite_drill(d: Drill, finished: Path) -> None:
    """The replaced run survives every end before the new run's first checkpoint, and goes once it has one."""
    run, before = copy_of(d, finished, "ow-signal")
    proc = d.start(run, "--overwrite_output_dir", "--max_train_steps", "5", "--checkpointing_steps", "5")
    seen = wait_for_line(proc, "data:")
    proc.send_signal(signal.SIGTERM)
    rc, out, hung = d.finish(proc)
    d.record(OVERWRITE, "SIGTERM at start-up", clean=rc == 0 and "no checkpoint written" in out
             and snapshot(run) == before, lost=snapshot(run) != before, hung=hung, outputs=("".join(seen), out))

    run, before = copy_of(d, finished, "ow-fail")
    rc, out, hung = d.finish(d.start(run, "--overwrite_output_dir", "--train_batch_size", "40000000"))
    d.record(OVERWRITE, "--train_batch_size 40000000 (fails)", clean=rc not in (0, None) and snapshot(run) == before,
             lost=snapshot(run) != before, hung=hung, outputs=(out,), exit_status=rc)

    run, before = copy_of(d, finished, "ow-kill")
    rc, out, hung = d.finish(d.start(run, "--overwrite_output_dir", "--max_train_steps", "3", "--checkpointing_steps",
                                     "3", helper=["-m", "tests.helpers.fail_at_step", "kill", "2"]))
    rc2, out2, hung2 = d.finish(d.start(run, "--resume_from_checkpoint", "latest"))
    d.record(OVERWRITE, "SIGKILL at step 2, then the same folder started again",
             clean=rc2 == 0 and "restored the run" in out2 and snapshot(run) == before,
             lost=snapshot(run) != before, hung=hung or hung2, outputs=(out2,))

    run, before = copy_of(d, finished, "ow-logdir")
    rc, out, err, hung = d.cli(["train_accelerate.py", *d.args(run, "--overwrite_output_dir", "--logging_dir", ".")])
    d.record(OVERWRITE, "--logging_dir . (the output folder itself)", clean=rc == 2 and one_line(err) is not None
             and snapshot(run) == before, lost=snapshot(run) != before, hung=hung, outputs=(out, err),
             message=one_line(err))

    run, _ = copy_of(d, finished, "ow-done")
    rc, out, hung = d.finish(d.start(run, "--overwrite_output_dir", "--max_train_steps", "1"))
    names = sorted(p.name for p in run.glob("checkpoint-*"))
    d.record(OVERWRITE, "the new run reaches its first checkpoint", clean=rc == 0 and names == ["checkpoint-1"]
             and not (run / ".replaced-run").exists(), hung=hung, outputs=(out,))


def non_run_drill(d: Drill) -> None:
    """A folder with someone's files is refused; with --overwrite_output_dir only a run's own names are touched."""
    folder = d.work / "not-a-run"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "unet").mkdir(parents=True)
    (folder / "README.md").write_text("mine\n")
    (folder / "notes.txt").write_text("keep me\n")
    before = snapshot(folder)
    rc, out, err, hung = d.cli(["train_accelerate.py", *d.args(folder, "--max_train_steps", "2")])
    line = one_line(err)
    d.record("non-run folder", "refused, naming its files", clean=rc == 2 and line is not None and "notes.txt" in line
             and snapshot(folder) == before, lost=snapshot(folder) != before, hung=hung, outputs=(out, err),
             message=line)
    rc, out, hung = d.finish(d.start(folder, "--overwrite_output_dir", "--max_train_steps", "2",
                                      f"--hub_token={SECRET}"))
    kept = (folder / "notes.txt").read_text() == "keep me\n" if (folder / "notes.txt").exists() else False
    d.record("non-run folder", "--overwrite_output_dir trains beside a foreign file", clean=rc == 0 and kept,
             lost=not kept, hung=hung, outputs=(out,))
    leaked = [str(p.relative_to(folder)) for p in folder.rglob("*")
              if p.is_file() and SECRET.encode() in p.read_bytes()]
    d.record("token echo", "--hub_token=... of a run: in no file of its folder", clean=not leaked, outputs=(),
             leaked=leaked)


def branch_drill(d: Drill, finished: Path) -> None:
    """Resuming an older checkpoint - one of the run's, or a copy kept outside it - moves the newer timeline aside;
    stats.jsonl keeps each step once."""
    for where in ("inside", "outside"):
        run = d.work / f"branch-{where}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(finished, run)
        older = sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-2]
        step = int(older.name.split("-")[1])
        if where == "outside":  # a copy kept elsewhere under another name: its manifest says its step
            kept_copy = d.work / "kept-elsewhere" / "bk"
            shutil.rmtree(kept_copy.parent, ignore_errors=True)
            kept_copy.parent.mkdir(parents=True)
            shutil.copytree(older, kept_copy)
            older = kept_copy
        newest = (run / f"checkpoint-{d.steps}" / "model.safetensors").read_bytes()
        rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", str(older), "--learning_rate", "1e-3"))
        aside = run / f"abandoned-after-{step}"
        kept = (aside / f"checkpoint-{d.steps}" / "model.safetensors").is_file() and \
            (aside / f"checkpoint-{d.steps}" / "model.safetensors").read_bytes() == newest
        steps = [json.loads(line)["step"] for line in (run / "stats.jsonl").read_text().splitlines()
                 if '"lr"' in line]
        d.record("branches", f"resume {'a copy kept outside the run of ' if where == 'outside' else ''}checkpoint-"
                 f"{step} of a finished run with a new --learning_rate",
                 clean=rc == 0 and kept and steps == sorted(set(steps)) and "moved aside" in out, lost=not kept,
                 hung=hung, outputs=(out,))


def blow_up_drill(d: Drill, finished: Path, reference_output: str) -> None:
    """A finite blow-up never rotates out the last checkpoint before it; a healthy run never trips the guard."""
    from adaptive.checkpoint import verify_checkpoint  # torch only where a check reads one

    run = d.work / "blow-up"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(finished, run)
    rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest", "--max_train_steps",
                                     str(d.steps + 6), "--checkpointing_steps", "1", "--checkpoints_total_limit", "1",
                                     "--learning_rate", "1e6", "--max_grad_norm", "1", "--lr_warmup_steps", "0"))
    last_good = run / f"checkpoint-{d.steps}"
    kept = last_good.is_dir() and verify_checkpoint(last_good) is None
    d.record("divergence", "finite blow-up (--learning_rate 1e6 --max_grad_norm 1, limit 1)",
             clean=rc in (0, 4) and kept and ("left its running range" in out or rc == 4), lost=not kept, hung=hung,
             outputs=(out,), exit_status=rc)
    limit_one_drill(d, finished)
    d.record("divergence", "healthy reference run: the guard never fires",
             clean="left its running range" not in reference_output, outputs=())


def limit_one_drill(d: Drill, finished: Path) -> None:
    """Issue 57's probe: a finite blow-up (lr 0.3, clipped) under --checkpoints_total_limit 1, then `latest` with a
    sane lr as the docs advise: a healthy checkpoint survives both, the rerun resumes it and leaves one timeline."""
    from adaptive.checkpoint import OUT_OF_RANGE, list_checkpoints, verify_checkpoint

    run = d.work / "blow-up-limit-1"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(finished, run)
    common = ["--checkpointing_steps", "2", "--checkpoints_total_limit", "1", "--logging_steps", "2",
              "--lr_warmup_steps", "0", "--max_grad_norm", "1"]
    rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest", "--max_train_steps",
                                     str(d.steps + 8), "--learning_rate", "0.3", *common))
    healthy = run / f"checkpoint-{d.steps}"
    later = [c for c in list_checkpoints(run) if int(c.name.split("-")[1]) > d.steps]
    kept = healthy.is_dir() and verify_checkpoint(healthy) is None
    d.record("divergence", "finite blow-up under --checkpoints_total_limit 1 (lr 0.3): later checkpoints marked",
             clean=rc in (0, 4) and kept and all((c / OUT_OF_RANGE).exists() for c in later), lost=not kept,
             hung=hung, outputs=(out,), exit_status=rc)
    rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest", "--max_train_steps",
                                     str(d.steps + 8), "--learning_rate", "1e-3", *common))
    steps = [json.loads(line)["step"] for line in (run / "stats.jsonl").read_text().splitlines() if '"lr"' in line]
    final = list_checkpoints(run)
    d.record("divergence", "then `latest` with a sane lr: resumes the healthy checkpoint, one timeline",
             clean=rc == 0 and f"{healthy} at step {d.steps}" in out and steps == sorted(set(steps))
             and [c.name for c in final] == [f"checkpoint-{d.steps + 8}"]
             and not (final[0] / OUT_OF_RANGE).exists(), lost=not final, hung=hung, outputs=(out,), exit_status=rc)


def signal_drill(d: Drill) -> None:
    """SIGHUP checkpoints like SIGTERM; a second Ctrl-C during an export stops at once, the previous export whole."""
    run = d.work / "sighup"
    shutil.rmtree(run, ignore_errors=True)
    proc = d.start(run, "--max_train_steps", "5")
    seen = wait_for_line(proc, "data:")
    proc.send_signal(signal.SIGHUP)
    rc, out, hung = d.finish(proc)
    d.record("SIGHUP / second Ctrl-C", "SIGHUP during start-up", clean=rc == 0 and "received SIGHUP" in out
             and any(run.glob("checkpoint-*")), lost=not any(run.glob("checkpoint-*")), hung=hung,
             outputs=("".join(seen), out))

    run = d.work / "ctrl-c"
    shutil.rmtree(run, ignore_errors=True)
    proc = d.popen(["-m", "tests.helpers.interrupted_export_train", "60",
                    *d.args(run, "--max_train_steps", "2", "--save_model_steps", "1")])
    seen = wait_for_line(proc, "EXPORTING")
    before = {k: v for k, v in snapshot(run).items() if k.split("/")[0] in ("unet", "scheduler", "model_index.json")}
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    rc, out, err, hung = finish_split(proc, limit=120)
    after = {k: v for k, v in snapshot(run).items() if k in before}
    record = json.loads((run / "export.json").read_text()) if (run / "export.json").exists() else {}
    line = one_line(err)
    d.record("SIGHUP / second Ctrl-C", "second Ctrl-C during an export", clean=rc == 130 and after == before
             and line is not None and record.get("step") == 1 and time.time() - t0 < 30, lost=after != before,
             hung=hung, outputs=("".join(seen), out, err), message=line)


def ddp_drill(d: Drill) -> None:
    """Two gloo ranks: one SIGKILLed or SIGSTOPped at step 2; the launch ends (within the DDP timeout), no hang."""
    accelerate = str(Path(sys.executable).parent / "accelerate")
    for fault in ("SIGKILL", "SIGSTOP"):
        run = d.work / f"ddp-{fault}"
        shutil.rmtree(run, ignore_errors=True)
        args = d.args(run, "--max_train_steps", "100000", "--checkpointing_steps", "100000",
                      "--ddp_timeout_minutes", "0.2")
        launcher = subprocess.Popen([accelerate, "launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
                                     "--num_processes", "2", "train_accelerate.py", *args], cwd=ROOT,
                                    env={**d.env, "ACCELERATE_USE_CPU": "1"}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        t0 = time.time()
        while last_step(run) < 2 and launcher.poll() is None and time.time() - t0 < LIMIT:
            time.sleep(0.2)
        ranks = rank_pids(launcher)
        if 1 in ranks:
            os.kill(ranks[1], getattr(signal, fault))
        t1 = time.time()
        rc, out, hung = d.finish(launcher, limit=240)
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        line = next((l for l in out.splitlines() if "train_accelerate.py: error:" in l), None)
        d.record("DDP faults", f"{fault} of rank 1 at step 2 (--ddp_timeout_minutes 0.2)",
                 clean=1 in ranks and rc not in (0, None) and line is not None, hung=hung,
                 outputs=(out,), seconds=round(time.time() - t1), message=line)

