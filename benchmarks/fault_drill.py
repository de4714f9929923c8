#!/usr/bin/env python
"""Fault drill: inject the faults a run meets in practice and check what survived (docs/reliability.md).

    python benchmarks/fault_drill.py                       # 5 kills, 3 corruptions, disk full, NaN, silent Hub
    python benchmarks/fault_drill.py --kills 20 --corruptions 10 --seed 1

Every run is a real train_accelerate.py process (cpu-tiny16 at toy size on generated images, the stateful
`adaptive` sampler, a checkpoint every 4 steps, an export every 8, 8 steps per kill + 8). Faults:
- kills: SIGKILL 1-3 steps after a (re)start at a random moment, during a checkpoint write
  (tests/helpers/slow_checkpoint_train.py widens the window) or during an export (tests/helpers/slow_export_train.py),
  in rotation; every kill is followed
  by the same command again (`--resume_from_checkpoint latest`), and the chain must end bit-identical to an
  uninterrupted run (parameters, EMA, optimizer, sampler state).
- corruptions of the newest checkpoint of the finished run (flipped bytes, a truncated file under a recomputed
  manifest, a manifest of the wrong shape, a deleted manifest, in rotation): the same command must skip it, resume
  from the previous one and end bit-identical.
- a disk that fills up while a checkpoint is written (a tmpfs in a private mount namespace; skipped where none can be
  mounted): one line, exit 5, the previous checkpoint byte-identical, no partial folder.
- a run whose loss becomes NaN: one line, exit 4, no export, the kept checkpoint finite.
- a Hub endpoint on the loopback address that accepts connections and never answers (--hub_upload_timeout): the
  run must end (needs that flag; skipped with a note where it does not exist).
Counted per fault: survived (the property above held), data lost (a valid checkpoint gone without a newer one, or a
final state that differs), hangs (a process over its time limit), tracebacks (any 'Traceback' a process printed).
Writes docs/benchmarks/faults/<date>/results.json and README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CKPT_EVERY, EXPORT_EVERY = 4, 8  # optimizer steps
RUN_FLAGS = ["--preset", "cpu-tiny16", "--logger", "none", "--num_grid_images", "2", "--ddpm_num_inference_steps", "2",
             "--train_batch_size", "4", "--timestep_sampler", "adaptive", "--adaptive_warmup_steps", "2",
             "--logging_steps", "1", "--save_images_steps", "none", "--lr_warmup_steps", "2"]
LIMIT = 600  # seconds a process may take before it counts as a hang


def make_data(folder: Path) -> Path:
    """24 smooth random 32 px images in two class folders (the drill never needs ../shared)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(12):
            grad = np.linspace(0, 1, 32)[None, :, None] * rng.integers(-80, 80, (1, 1, 3))
            img = np.clip(rng.integers(0, 256, (1, 1, 3)) + grad + rng.normal(0, 10, (32, 32, 3)), 0, 255)
            Image.fromarray(img.astype(np.uint8)).save(folder / c / f"{i:02d}.png")
    return folder


class Drill:
    def __init__(self, work: Path, data: Path, steps: int):
        self.work, self.data, self.steps = work, data, steps
        self.records: list[dict] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def args(self, run: Path, *extra: str) -> list[str]:
        return [*RUN_FLAGS, "--max_train_steps", str(self.steps), "--checkpointing_steps", str(CKPT_EVERY),
                "--save_model_steps", str(EXPORT_EVERY), "--train_data_dir", str(self.data), "--output_dir", str(run),
                *extra]

    def start(self, run: Path, *extra: str, helper: list[str] | None = None, env: dict | None = None):
        script = helper or ["train_accelerate.py"]
        return subprocess.Popen([sys.executable, *script, *self.args(run, *extra)], cwd=ROOT, env=env or self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self, proc: subprocess.Popen, limit: float = LIMIT) -> tuple[int | None, str, bool]:
        """(exit status, output, hung)."""
        try:
            out, _ = proc.communicate(timeout=limit)
            return proc.returncode, out, False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            return None, out, True

    def record(self, kind: str, detail: str, survived: bool, data_lost: bool, hung: bool, outputs: list[str],
               **extra) -> dict:
        rec = {"fault": kind, "detail": detail, "survived": survived, "data_lost": data_lost, "hung": hung,
               "tracebacks": sum(o.count("Traceback (most recent call last)") for o in outputs), **extra}
        self.records.append(rec)
        print(json.dumps(rec), flush=True)
        return rec


def last_step(run: Path) -> int:
    try:
        lines = (run / "stats.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(line)["step"] for line in lines if line.strip().endswith("}")), default=0)


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def newest_valid(run: Path) -> int:
    from adaptive.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

    return max((checkpoint_step(p) for p in list_checkpoints(run) if verify_checkpoint(p, full=False) is None),
               default=0)


def state_digest(ckpt: Path) -> str:
    """sha256 over the training state proper: parameters, EMA, optimizer state, timestep-sampler state and progress
    (not the RNG pickles' or manifest's bytes, which also hold paths and timings)."""
    import torch
    from safetensors.torch import load_file

    from adaptive.checkpoint import load_ema_weights, load_object_state

    h = hashlib.sha256()

    def add(obj):
        if isinstance(obj, dict):
            for k in sorted(obj, key=str):
                h.update(str(k).encode())
                add(obj[k])
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                add(v)
        elif isinstance(obj, torch.Tensor):
            h.update(obj.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(obj).encode())

    add(load_file(str(ckpt / "model.safetensors")))
    add(load_ema_weights(ckpt))
    state = load_object_state(ckpt / "training_state.pt")
    state["progress"].pop("train_seconds", None)  # wall-clock
    add(state)
    add(torch.load(ckpt / "optimizer.bin", weights_only=True)["state"])
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the drills


def kill_drill(d: Drill, n: int, rng: random.Random, reference: str) -> Path:
    run = d.work / "killed"
    kinds = ["training", "checkpoint write", "export"]
    outputs, lost, pending = [], False, []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        helper = {"checkpoint write": ["tests/helpers/slow_checkpoint_train.py", "30"],
                  "export": ["tests/helpers/slow_export_train.py", "30"]}.get(kind)
        proc = d.start(run, "--resume_from_checkpoint", "latest", helper=helper)
        t0, seen, ok = time.time(), [], True
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
                ok = False
                break
            time.sleep(0.05)
        if kind == "training":
            time.sleep(rng.uniform(0.0, 0.5))  # somewhere in the next step
        before = newest_valid(run)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=10)
        outputs.append("".join(seen))
        after = newest_valid(run)
        lost = lost or after < before
        pending.append({"kind": kind, "injected": ok, "newest_valid_before": before, "newest_valid_after": after,
                        "at_step": last_step(run)})
    rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest"))
    outputs.append(out)
    final = run / f"checkpoint-{d.steps}"
    same = rc == 0 and final.is_dir() and state_digest(final) == reference
    exported = json.loads((run / "export.json").read_text())["step"] == d.steps if rc == 0 else False
    for i, p in enumerate(pending):
        d.record("SIGKILL", f"during {p['kind']} (step {p['at_step']})", survived=same and exported and p["injected"],
                 data_lost=p["newest_valid_after"] < p["newest_valid_before"] or not same, hung=hung and i == n - 1,
                 outputs=[outputs[i]] + ([out] if i == n - 1 else []), injected=p["injected"])
    return run


def corrupt(ckpt: Path, mode: str) -> None:
    from adaptive.checkpoint import MANIFEST, checkpoint_step, write_manifest

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


CORRUPTIONS = ["flipped bytes in model.safetensors", "optimizer.bin truncated, manifest recomputed",
               'manifest {"files": "abc"}', "manifest deleted"]


def corruption_drill(d: Drill, n: int, finished: Path, reference: str) -> None:
    for i in range(n):
        mode = CORRUPTIONS[i % len(CORRUPTIONS)]
        run = d.work / f"corrupt{i}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(finished, run)
        corrupt(run / f"checkpoint-{d.steps}", mode)
        rc, out, hung = d.finish(d.start(run, "--resume_from_checkpoint", "latest"))
        skipped = f"warning: skipping checkpoint-{d.steps}" in out and f"at step {d.steps - CKPT_EVERY}" in out
        same = rc == 0 and state_digest(run / f"checkpoint-{d.steps}") == reference
        d.record("corrupt newest checkpoint", mode, survived=skipped and same, data_lost=not same, hung=hung,
                 outputs=[out])


def disk_full_drill(d: Drill) -> None:
    mount = d.work / "tmpfs"
    mount.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mount}"],
                           capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        d.record("disk full", "no tmpfs can be mounted here (unshare -rm)", survived=None, data_lost=False,
                 hung=False, outputs=[], skipped=True)
        return
    result = d.work / "disk_full.json"
    try:
        proc = subprocess.run(["unshare", "-rm", sys.executable, "tests/helpers/disk_full_run.py", "30", str(mount),
                               str(result), "--", *RUN_FLAGS, "--train_data_dir", str(d.data)], cwd=ROOT, env=d.env,
                              capture_output=True, text=True, timeout=2 * LIMIT)
        hung = False
    except subprocess.TimeoutExpired:
        d.record("disk full", "checkpoint write on a 30 MB tmpfs", survived=False, data_lost=False, hung=True,
                 outputs=[])
        return
    r = json.loads(result.read_text())
    lines = [line for line in r.get("second_stderr", "").splitlines() if line.strip()]
    ok = (r["first_rc"] == 0 and r.get("second_rc") == 5 and len(lines) == 1 and "disk full" in lines[0]
          and r["after"] == r["before"] and not any(n.startswith(".checkpoint-") for n in r["listing"]))
    d.record("disk full", "checkpoint write on a 30 MB tmpfs", survived=ok, data_lost=r.get("after") != r.get("before"),
             hung=hung, outputs=[proc.stdout, proc.stderr, r.get("first_stderr", ""), r.get("second_stderr", ""),
                                 r.get("second_stdout", "")], message=lines[0] if lines else None)


def nan_drill(d: Drill) -> None:
    import torch
    from safetensors.torch import load_file

    from adaptive.checkpoint import list_checkpoints, load_ema_weights

    run = d.work / "nan"
    shutil.rmtree(run, ignore_errors=True)
    rc, out, hung = d.finish(d.start(run, "--learning_rate", "1e4", "--max_grad_norm", "0", "--lr_warmup_steps", "0",
                                     "--checkpointing_steps", "1", "--checkpoints_total_limit", "1"))
    ckpts = list_checkpoints(run)
    finite = all(torch.isfinite(t).all() for c in ckpts for weights in (load_file(str(c / "model.safetensors")),
                                                                         load_ema_weights(c)) for t in weights.values())
    message = next((line for line in out.splitlines() if "training diverged" in line), None)
    ok = rc == 4 and message is not None and finite and not (run / "model_index.json").exists()
    d.record("NaN loss", "--learning_rate 1e4 --max_grad_norm 0", survived=ok, data_lost=not finite, hung=hung,
             outputs=[out], message=message)


def silent_hub_drill(d: Drill) -> None:
    from adaptive.config import TrainConfig

    if "hub_upload_timeout" not in TrainConfig.__dataclass_fields__:
        d.record("silent Hub endpoint", "this build has no --hub_upload_timeout (issue 15 item 6 adds it)",
                 survived=None, data_lost=False, hung=False, outputs=[], skipped=True)
        return
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    accept = threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(1000)], daemon=True)
    accept.start()
    run = d.work / "hub"
    shutil.rmtree(run, ignore_errors=True)
    env = {**d.env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{server.getsockname()[1]}",
           "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_DISABLE_TELEMETRY": "1"}
    t0 = time.time()
    rc, out, hung = d.finish(d.start(run, "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "drill/silent",
                                     "--hub_token", "hf_DrillTokenNotReal0123456789", "--hub_upload_timeout", "10",
                                     env=env))
    server.close()
    # Ends either way: refused up front (the repo check times out: exit 2, nothing trained) or trained, exported and
    # the upload given up after --hub_upload_timeout (exit 3, everything local) - never a hang.
    message = next((line for line in out.splitlines() if line.startswith("train_accelerate.py: error:")), None)
    d.record("silent Hub endpoint", "accepts, never answers; --hub_upload_timeout 10",
             survived=rc in (0, 2, 3) and not hung and (rc != 2 or message is not None),
             data_lost=rc in (0, 3) and not (run / "export.json").exists(), hung=hung, outputs=[out],
             seconds=round(time.time() - t0), exit_status=rc, message=message)


# ------------------------------------------------------------------------------------------------ report


def summarize(records: list[dict]) -> dict:
    done = [r for r in records if not r.get("skipped")]
    return {"faults_injected": len(done), "survived": sum(bool(r["survived"]) for r in done),
            "survived_bit_identical_resume": sum(bool(r["survived"]) for r in done
                                                 if r["fault"] in ("SIGKILL", "corrupt newest checkpoint")),
            "resume_faults": sum(r["fault"] in ("SIGKILL", "corrupt newest checkpoint") for r in done),
            "data_lost": sum(bool(r["data_lost"]) for r in done), "hangs": sum(bool(r["hung"]) for r in done),
            "tracebacks": sum(r["tracebacks"] for r in done), "skipped": [r["fault"] for r in records if r.get("skipped")]}


def readme(meta: dict, records: list[dict], s: dict) -> str:
    lines = [f"# Fault drill ({meta['date']})", "",
             f"Command: `{meta['command']}`; commit `{meta['commit']}`; torch {meta['torch']}; {meta['seconds']:.0f} s; "
             f"load average at start {meta['load_start']}, at end {meta['load_end']} on {os.cpu_count()} CPUs. "
             "What each fault and column means: the docstring of `benchmarks/fault_drill.py` and "
             "[docs/reliability.md](../../../reliability.md).", "",
             "| faults injected | survived with bit-identical resume | other faults handled as specified | data lost "
             "(must be 0) | hangs (must be 0) | tracebacks shown to the user (must be 0) |",
             "|---|---|---|---|---|---|",
             f"| {s['faults_injected']} | {s['survived_bit_identical_resume']} / {s['resume_faults']} | "
             f"{s['survived'] - s['survived_bit_identical_resume']} / {s['faults_injected'] - s['resume_faults']} | "
             f"{s['data_lost']} | {s['hangs']} | {s['tracebacks']} |", ""]
    if s["skipped"]:
        lines += [f"Skipped: {'; '.join(r['fault'] + ' - ' + r['detail'] for r in records if r.get('skipped'))}.", ""]
    lines += ["| fault | detail | survived | data lost | hung | tracebacks |", "|---|---|---|---|---|---|"]
    for r in records:
        survived = "skipped" if r.get("skipped") else "yes" if r["survived"] else "NO"
        lines.append(f"| {r['fault']} | {r['detail']} | {survived} | {'YES' if r['data_lost'] else 'no'} | "
                     f"{'YES' if r['hung'] else 'no'} | {r['tracebacks']} |")
    messages = [r["message"] for r in records if r.get("message")]
    if messages:
        lines += ["", "The one-line messages the user saw:", ""] + [f"- `{m}`" for m in messages]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--kills", type=int, default=5, help="SIGKILLs (rotating: training, checkpoint write, export)")
    p.add_argument("--corruptions", type=int, default=3, help="corruptions of the newest checkpoint (rotating kinds)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    p.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "_work" / "faults", help="scratch folder")
    p.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks/faults/<date>")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    t0, load_start = time.time(), "/".join(f"{x:.1f}" for x in os.getloadavg())
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    d = Drill(args.work, make_data(args.work / "data"), steps=EXPORT_EVERY * (args.kills + 1))

    # The uninterrupted reference.
    rc, out, hung = d.finish(d.start(args.work / "straight"))
    if rc != 0:
        raise SystemExit(f"the reference run failed:\n{out[-3000:]}")
    reference = state_digest(args.work / "straight" / f"checkpoint-{d.steps}")

    finished = kill_drill(d, args.kills, random.Random(args.seed), reference)
    corruption_drill(d, args.corruptions, finished, reference)
    disk_full_drill(d)
    nan_drill(d)
    silent_hub_drill(d)

    s = summarize(d.records)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    meta = {"date": dt.date.today().isoformat(), "command": " ".join(["python", "benchmarks/fault_drill.py", *(argv or sys.argv[1:])]),
            "commit": commit, "torch": torch.__version__, "seconds": time.time() - t0, "load_start": load_start,
            "load_end": "/".join(f"{x:.1f}" for x in os.getloadavg()), "steps": d.steps, "run_flags": d.args(Path("RUN"))}
    out_dir = args.out or ROOT / "docs" / "benchmarks" / "faults" / meta["date"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "summary": s, "faults": d.records}, indent=1) + "\n")
    (out_dir / "README.md").write_text(readme(meta, d.records, s))
    print(json.dumps(s))
    return 0 if s["data_lost"] == 0 and s["hangs"] == 0 and s["tracebacks"] == 0 and s["survived"] == s["faults_injected"] else 1


if __name__ == "__main__":
    sys.exit(main())
