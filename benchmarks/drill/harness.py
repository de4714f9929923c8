"""What every drill case uses: real CLI processes with a time limit, one record per case (category, case, clean, lost,
hung, tracebacks), folder snapshots, the training-state digest, the ranks of an `accelerate launch`, and a Hub
endpoint that accepts and never answers."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CKPT_EVERY, EXPORT_EVERY = 4, 8  # optimizer steps
RUN_FLAGS = ["--preset", "cpu-tiny16", "--logger", "none", "--num_grid_images", "2", "--ddpm_num_inference_steps", "2",
             "--train_batch_size", "4", "--timestep_sampler", "adaptive", "--adaptive_warmup_steps", "2",
             "--logging_steps", "1", "--save_images_steps", "none", "--lr_warmup_steps", "2"]
LIMIT = 600  # seconds a process may take before it counts as a hang
SECRET = "hf_DrillSecretToken0123456789abcdef"


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


def tracebacks(text: str) -> int:
    """Python tracebacks in `text`, not counting the launcher's own failure report (torchrun's ChildFailedError)."""
    return sum("ChildFailedError" not in block for block in text.split("Traceback (most recent call last)")[1:])


class Drill:
    def __init__(self, work: Path, data: Path, steps: int):
        self.work, self.data, self.steps = work, data, steps
        self.records: list[dict] = []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.lock = threading.Lock()

    def args(self, run: Path, *extra: str) -> list[str]:
        return [*RUN_FLAGS, "--max_train_steps", str(self.steps), "--checkpointing_steps", str(CKPT_EVERY),
                "--save_model_steps", str(EXPORT_EVERY), "--train_data_dir", str(self.data), "--output_dir", str(run),
                *extra]

    def start(self, run: Path, *extra: str, helper: list[str] | None = None, env: dict | None = None):
        """train_accelerate.py (or a test helper wrapping it) on the drill's data; stdout and stderr merged."""
        return self.popen([*(helper or ["train_accelerate.py"]), *self.args(run, *extra)], env=env,
                          stderr=subprocess.STDOUT)

    def popen(self, argv: list[str], env: dict | None = None, stderr=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=stderr, text=True)

    def finish(self, proc: subprocess.Popen, limit: float = LIMIT) -> tuple[int | None, str, bool]:
        """(exit status, stdout + stderr, hung)."""
        try:
            out, err = proc.communicate(timeout=limit)
            return proc.returncode, out + (err or ""), False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return None, out + (err or ""), True

    def cli(self, argv: list[str], env: dict | None = None, limit: float = LIMIT) -> tuple[int | None, str, str, bool]:
        """(exit status, stdout, stderr, hung) of `python argv...`."""
        return finish_split(self.popen(argv, env=env), limit)

    def record(self, category: str, case: str, clean: bool, lost: bool = False, hung: bool = False,
               outputs: tuple[str, ...] = (), **extra) -> dict:
        rec = {"category": category, "case": case, "clean": bool(clean) and not hung, "lost": bool(lost),
               "hung": bool(hung), "tracebacks": sum(tracebacks(o or "") for o in outputs), **extra}
        with self.lock:
            self.records.append(rec)
        print(json.dumps(rec), flush=True)
        return rec


def finish_split(proc: subprocess.Popen, limit: float = LIMIT) -> tuple[int | None, str, str, bool]:
    """(exit status, stdout, stderr, hung) of a process started with stderr=PIPE."""
    try:
        out, err = proc.communicate(timeout=limit)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err, True


def one_line(err: str) -> str | None:
    """The single non-empty stderr line, or None when there are none or several."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else None


def wait_for_line(proc: subprocess.Popen, marker: str, limit: float = LIMIT) -> list[str]:
    """Read proc.stdout until a line holds `marker` (or the process ends / the limit passes); the lines read."""
    lines, t0 = [], time.time()
    while time.time() - t0 < limit:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if marker in line:
            break
    return lines


def rank_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the worker processes of an `accelerate launch`."""
    found = {}
    for task in Path(f"/proc/{launcher.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ranks = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"RANK=")]
            if ranks:
                found[ranks[0]] = int(pid)
    return found


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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
    # torch only where a check reads a checkpoint
    from adaptive.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint  # deferred: torch

    return max((checkpoint_step(p) for p in list_checkpoints(run) if verify_checkpoint(p, full=False) is None),
               default=0)


def state_digest(ckpt: Path) -> str:
    """sha256 over the training state proper: parameters, EMA, optimizer state, timestep-sampler state and progress
    (not the RNG pickles' or manifest's bytes, which also hold paths and timings)."""
    import torch
    from safetensors.torch import load_file

    from adaptive.checkpoint import load_ema_weights, load_object_state  # torch only where a check reads one

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


class SilentHub:
    """A Hub endpoint on the loopback address that accepts connections and never answers."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connected, self.held = threading.Event(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(conn)
            self.connected.set()

    def env(self, base: dict, home: Path) -> dict:
        """`base` pointed at this endpoint, online, with an empty Hub cache."""
        env = {k: v for k, v in base.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        return {**env, "HF_ENDPOINT": self.url, "HF_HOME": str(home), "NO_PROXY": "127.0.0.1,localhost",
                "HF_HUB_DISABLE_TELEMETRY": "1"}

    def close(self):
        self.server.close()
        for conn in self.held:
            conn.close()
