#!/usr/bin/env python
"""Why the run's background Hub uploader (adaptive/hub.py: HubUploader) is not huggingface_hub's own background upload
(`HfApi.upload_folder(..., run_as_future=True)`, one executor thread per HfApi) - measured, offline (issue 56):

1. exit: a training process ends while its last upload hangs on a Hub that accepts connections and never answers
   (loopback); seconds until the process is gone.
2. coalescing: five exports pushed while the first upload is still in flight (a fake 0.5 s upload, no network);
   how many uploads run.
3. redaction: which pushed files carry the run's local paths (the run's config.json keeps them for resuming).

    python benchmarks/hub_uploader.py --out docs/benchmarks/hub/<date>

Writes results.json, README.md (a table) and hub_uploader.png into --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from adaptive.config import TrainConfig
from adaptive.hub import HubUploader, commit_files
from adaptive.hub_wait import REQUEST_TIMEOUT_S
from benchmarks.drill.harness import SilentHub
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

CAP_S = 150.0  # a process still alive after this long is killed and reported as ">= CAP_S"

FUTURE_SCRIPT = """
import sys
from huggingface_hub import HfApi
{timeout}
api = HfApi(endpoint={url!r}, token="hf_benchmarkTokenNotReal0000000000")
api.upload_folder(repo_id="me/run", folder_path={folder!r}, run_as_future=True)
print("training done, exiting", flush=True)
sys.exit(0)
"""

OURS_SCRIPT = """
import sys
from adaptive.hub import HubUploader
up = HubUploader("me/run", "hf_benchmarkTokenNotReal0000000000", endpoint={url!r}, log=lambda m: None)
up.push({folder!r}, "final export")
up.close(timeout=2.0)  # what finish_uploads does at the end of training, with its bound
print("training done, exiting", flush=True)
sys.exit(0)
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def run_folder(root: Path) -> Path:
    """A minimal run folder: the run's config.json (with its local paths), a model_index.json and a card."""
    out = root / "runs" / "my-local-run"
    out.mkdir(parents=True)
    cfg = TrainConfig(output_dir=str(out), train_data_dir=str(root / "data" / "images.zip"))
    (out / "config.json").write_text(cfg.to_json())
    (out / "model_index.json").write_text(json.dumps({"_class_name": "DDPMPipeline"}))
    (out / "README.md").write_text("# a run\n")
    return out


def seconds_to_exit(script: str, hub: SilentHub, home: Path) -> float:
    env = hub.env(dict(os.environ), home)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=CAP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return float("inf")
    return time.perf_counter() - t0


def exit_times(folder: Path, home: Path) -> dict:
    hub = SilentHub()
    try:
        timeout = (f"from adaptive.hub_wait import use_request_timeout; use_request_timeout({REQUEST_TIMEOUT_S})")
        return {
            "run_as_future": seconds_to_exit(FUTURE_SCRIPT.format(url=hub.url, folder=str(folder), timeout=""),
                                             hub, home),
            "run_as_future_with_request_timeout": seconds_to_exit(
                FUTURE_SCRIPT.format(url=hub.url, folder=str(folder), timeout=timeout), hub, home),
            "HubUploader": seconds_to_exit(OURS_SCRIPT.format(url=hub.url, folder=str(folder)), hub, home),
        }
    finally:
        hub.close()


def uploads_for_five_pushes(folder: Path) -> dict:
    """Five pushes 50 ms apart while each upload takes 0.5 s: how many uploads each runs (a fake upload)."""
    from huggingface_hub import HfApi

    done = {"run_as_future": 0, "HubUploader": 0}
    lock = threading.Lock()

    def fake_upload(kind):
        time.sleep(0.5)
        with lock:
            done[kind] += 1

    api = HfApi(token="hf_benchmarkTokenNotReal0000000000")
    futures = []
    for _ in range(5):
        futures.append(api.run_as_future(fake_upload, "run_as_future"))
        time.sleep(0.05)
    for f in futures:
        f.result()

    up = HubUploader("me/run", "hf_benchmarkTokenNotReal0000000000", log=lambda m: None)
    up._repo_ready = True  # no repo to create: the fake upload stands for the commit
    up._attempt = lambda folder, message: fake_upload("HubUploader")
    for i in range(5):
        up.push(folder, f"export {i}")
        time.sleep(0.05)
    up.close(timeout=30)
    return done


def files_with_local_paths(folder: Path) -> dict:
    """Which pushed files contain the run's local paths: upload_folder sends the files as they are on disk;
    HubUploader sends commit_files (the run's JSON files redacted)."""
    local = [str(folder), str(folder.parent.parent / "data")]
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                     and any(s in p.read_text(errors="replace") for s in local))
    ours = []
    for rel, content in commit_files(folder, push_checkpoints=False).items():
        text = content.read_text(errors="replace") if isinstance(content, Path) else content.decode(errors="replace")
        if any(s in text for s in local):
            ours.append(rel)
    return {"upload_folder": on_disk, "HubUploader": sorted(ours)}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    ex = results["exit_seconds"]
    names = list(ex)
    a.barh(names, [min(v, CAP_S) for v in ex.values()], color=["#c44", "#c84", "#48c"])
    a.set_xlabel(f"seconds until the process exits (capped at {CAP_S:g})")
    a.set_title("exit with an upload hanging")
    up = results["uploads_for_five_pushes"]
    b.bar(list(up), list(up.values()), color=["#c44", "#48c"])
    b.set_ylabel("uploads run")
    b.set_title("five pushes during one upload")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict) -> str:
    ex, up, red = results["exit_seconds"], results["uploads_for_five_pushes"], results["files_with_local_paths"]

    def secs(v):
        return f">= {CAP_S:g} (killed)" if v == float("inf") else f"{v:.1f}"

    return "\n".join([
        "| | `upload_folder(run_as_future=True)` | `HubUploader` |",
        "|---|---|---|",
        f"| seconds to exit, last upload hanging (huggingface_hub's default timeouts) | {secs(ex['run_as_future'])} | "
        f"{secs(ex['HubUploader'])} |",
        f"| the same, with the run's {REQUEST_TIMEOUT_S:g} s request timeout installed | "
        f"{secs(ex['run_as_future_with_request_timeout'])} | {secs(ex['HubUploader'])} |",
        f"| uploads run for 5 pushes during one 0.5 s upload | {up['run_as_future']} | {up['HubUploader']} |",
        f"| pushed files holding local paths | {', '.join(red['upload_folder']) or 'none'} | "
        f"{', '.join(red['HubUploader']) or 'none'} |",
    ])


def main(argv=None) -> int:
    import huggingface_hub

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = run_folder(Path(tmp))
        results = {
            "date": dt.date.today().isoformat(),
            "huggingface_hub": huggingface_hub.__version__,
            "request_timeout_s": REQUEST_TIMEOUT_S,
            "exit_seconds": exit_times(folder, Path(tmp) / "hf-home"),
            "uploads_for_five_pushes": uploads_for_five_pushes(folder),
            "files_with_local_paths": files_with_local_paths(folder),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    plot(results, args.out / "hub_uploader.png")
    (args.out / "README.md").write_text(
        f"# Background Hub upload: huggingface_hub's `run_as_future` against the run's `HubUploader` "
        f"({results['date']})\n\n"
        f"Command: `python benchmarks/hub_uploader.py --out {args.out}`; huggingface_hub "
        f"{results['huggingface_hub']}, offline (a loopback endpoint that never answers; fake 0.5 s uploads).\n\n"
        + table(results) + "\n\n![exit and coalescing](hub_uploader.png)\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
