"""Faults that a resume must survive bit-identically (SIGKILLs, corrupt checkpoints) and faults that must stop a run
in one line with the previous checkpoint intact (a full disk, a NaN loss)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from .harness import CKPT_EVERY, LIMIT, ROOT, RUN_FLAGS, Drill, last_step, mtime, newest_valid, one_line, state_digest

HELPERS = {"checkpoint write": ["-m", "tests.helpers.slow_checkpoint_train", "30"],
           "export": ["-m", "tests.helpers.slow_export_train", "30"]}


def kill_once(d: Drill, run: Path, kind: str, rng: random.Random) -> dict:
    """Start the run (latest), SIGKILL it 1-3 steps in, during a checkpoint write or during an export."""
    proc = d.start(run, "--resume_from_checkpoint", "latest", helper=HELPERS.get(kind))
    t0, seen, injected = time.time(), [], True
    target = newest_valid(run) + rng.randint(1, 3)  # the resumed step + 1-3
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()

    def ready() -> bool:
        if kind == "checkpoint write":  # this process's write (a killed one's stale folder is older)
            return any(mtime(p) > t0 for p in run.glob(".checkpoint-*.tmp"))
        if kind == "export":
            return any("EXPORTING" in line for line in seen)
        return any(line.startswith("step ") and int(line.split()[1].split("/")[0]) >= target for line in seen)

    while not ready():
        if proc.poll() is not None or time.time() - t0 > LIMIT:
            injected = False
            break
        time.sleep(0.05)
    if kind == "training":
        time.sleep(rng.uniform(0.0, 0.5))  # somewhere in the next step
    before = newest_valid(run)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    reader.join(timeout=10)
    return {"kind": kind, "injected": injected, "before": before, "after": newest_valid(run), "at": last_step(run),
            "output": "".join(seen)}


def kill_drill(d: Drill, n: int, rng: random.Random, reference: str) -> Path:
    """n SIGKILLs in rotation, each followed by the same command; the chain must end bit-identical."""
    run = d.work / "killed"
    kinds = ["training", "checkpoint write", "export"]
    kills = [kill_once(d, run, kinds[i % len(kinds)], rng) for i in range(n)]
    rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest"))
    final = run / f"checkpoint-{d.steps}"
    same = rc == 0 and final.is_dir() and state_digest(final) == reference
    exported = rc == 0 and json.loads((run / "export.json").read_text())["step"] == d.steps
    for i, k in enumerate(kills):
        last = i == n - 1
        d.record("SIGKILL + resume", f"during {k['kind']} (step {k['at']})", clean=same and exported and k["injected"],
                 lost=k["after"] < k["before"] or not same, hung=hung and last,
                 outputs=(k["output"], out if last else ""))
    return run


CORRUPTIONS = ["flipped bytes in model.safetensors", "optimizer.bin truncated, manifest recomputed",
               'manifest {"files": "abc"}', "manifest deleted"]


def corrupt(ckpt: Path, mode: str) -> None:
    from adaptive.checkpoint import MANIFEST, checkpoint_step, write_manifest  # torch only where a check reads one

    if mode == "flipped bytes in model.safetensors":
        p = ckpt / "model.safetensors"
        data = bytearray(p.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
        p.write_bytes(bytes(data))
    elif mode == "optimizer.bin truncated, manifest recomputed":
        with open(ckpt / "optimizer.bin", "r+b") as f:
            f.truncate((ckpt / "optimizer.bin").stat().st_size // 2)
        write_manifest(ckpt, checkpoint_step(ckpt))
    elif mode == 'manifest {"files": "abc"}':
        (ckpt / MANIFEST).write_text('{"files": "abc"}')
    elif mode == "manifest deleted":
        (ckpt / MANIFEST).unlink()


def corruption_drill(d: Drill, n: int, finished: Path, reference: str) -> None:
    """The newest checkpoint of a finished run corrupted: `latest` skips it and ends bit-identical."""
    for i in range(n):
        mode = CORRUPTIONS[i % len(CORRUPTIONS)]
        run = d.work / f"corrupt{i}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(finished, run)
        corrupt(run / f"checkpoint-{d.steps}", mode)
        rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest"))
        skipped = f"warning: skipping checkpoint-{d.steps}" in out and f"at step {d.steps - CKPT_EVERY}" in out
        same = rc == 0 and state_digest(run / f"checkpoint-{d.steps}") == reference
        d.record("corrupt checkpoint", mode, clean=skipped and same, lost=not same, hung=hung, outputs=(out,))


def disk_full_drill(d: Drill) -> None:
    """A checkpoint write on a full tmpfs (private mount namespace): exit 5, the previous checkpoint intact."""
    mount = d.work / "tmpfs"
    mount.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mount}"],
                           capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        d.record("disk full", "no tmpfs can be mounted here (unshare -rm)", clean=False, skipped=True)
        return
    result = d.work / "disk_full.json"
    try:
        proc = subprocess.run(["unshare", "-rm", sys.executable, "-m", "tests.helpers.disk_full_run", "30", str(mount),
                               str(result), "--", *RUN_FLAGS, "--train_data_dir", str(d.data)], cwd=ROOT, env=d.env,
                              capture_output=True, text=True, timeout=2 * LIMIT)
    except subprocess.TimeoutExpired:
        d.record("disk full", "checkpoint write on a 30 MB tmpfs", clean=False, hung=True)
        return
    r = json.loads(result.read_text())
    line = one_line(r.get("second_stderr", ""))
    ok = (r["first_rc"] == 0 and r.get("second_rc") == 5 and line is not None and "disk full" in line
          and r["after"] == r["before"] and not any(n.startswith(".checkpoint-") for n in r["listing"]))
    d.record("disk full", "checkpoint write on a 30 MB tmpfs", clean=ok, lost=r.get("after") != r.get("before"),
             outputs=(proc.stdout, proc.stderr, r.get("first_stderr", ""), r.get("second_stderr", ""),
                      r.get("second_stdout", "")), message=line)


def nan_drill(d: Drill) -> None:
    """A loss that becomes NaN: exit 4 in one line, no export, every kept checkpoint finite."""
    import torch
    from safetensors.torch import load_file

    from adaptive.checkpoint import list_checkpoints, load_ema_weights  # torch only where a check reads one

    run = d.work / "nan"
    shutil.rmtree(run, ignore_errors=True)
    rc, out, hung = d.finish(d.start(run, "--learning_rate", "1e4", "--max_grad_norm", "0", "--lr_warmup_steps", "0",
                                     "--checkpointing_steps", "1", "--checkpoints_total_limit", "1"))
    ckpts = list_checkpoints(run)
    finite = all(torch.isfinite(t).all() for c in ckpts for weights in (load_file(str(c / "model.safetensors")),
                                                                         load_ema_weights(c)) for t in weights.values())
    message = next((line for line in out.splitlines() if "training diverged" in line), None)
    ok = rc == 4 and message is not None and finite and not (run / "model_index.json").exists()
    d.record("divergence", "NaN loss (--learning_rate 1e4 --max_grad_norm 0)", clean=ok, lost=not finite, hung=hung,
             outputs=(out,), message=message)
