"""Park benchmark runs that outlive their machine: stop each run, keep only its newest valid checkpoint, and stage its
folder in git (benchmarks/_work/ is ignored, hence `git add -f`), so that a fresh checkout resumes it with the same
command from the same pinned commit. Procedure and sizes: docs/benchmarks/README.md, "Runs that outlive their
machine".

    python benchmarks/park_runs.py benchmarks/_work/cal32 benchmarks/_work/long32      # stop, prune, stage
    python benchmarks/park_runs.py --dry_run benchmarks/_work/cal32                     # say what it would do

A run is stopped the way a preemption stops it: SIGTERM to the process holding the run folder's lock (it finishes an
evaluation in progress, writes its checkpoint and exits 0), after SIGTERM to the compare_methods.py that started it,
so that the benchmark neither starts the next run nor writes a partial report. Nothing is deleted unless the run has
a checkpoint that verifies (manifest, sizes, sha256); an older checkpoint is deleted only once a newer one verifies.

A folder with no checkpoint at all (a finished run's records that compare_methods.py restored from OUT/runs into a
fresh checkout, or a run not yet at its first checkpoint) has nothing to park and is left alone.

A finished run (its pipeline exported at its newest checkpoint's step) has nothing to resume: it is neither pruned nor
staged, and a copy of it that an earlier park staged is taken out of the index (git rm --cached; the files stay), since
a fresh checkout would resume that older checkpoint. compare_methods.py keeps each finished run's records in OUT/runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from adaptive.checkpoint import checkpoint_step, find_latest, list_checkpoints
from adaptive.config import ConfigError
from adaptive.rundir import artifact, exported_step, lock_holder, run_holds_training
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]


def run_folders(paths: list[Path]) -> list[Path]:
    """Each path that holds a training run, or its sub-folders that do (a compare_methods.py --work folder)."""
    found = []
    for p in paths:
        if run_holds_training(p):
            found.append(p)
        elif p.is_dir():
            found += sorted(d for d in p.iterdir() if d.is_dir() and run_holds_training(d))
    return found


def holder(run: Path) -> int | None:
    """PID of the training process that holds the run folder's lock, or None."""
    lock = artifact(run, "lock")
    return lock_holder(lock) if lock.exists() else None


def parent_benchmark(pid: int) -> int | None:
    """PID of the compare_methods.py that started `pid`, or None."""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    return ppid if is_benchmark_driver(cmdline) else None


def is_benchmark_driver(cmdline: list[bytes]) -> bool:
    """A compare_methods command line: by path, or as a module (`python -m benchmarks.compare_methods`, the form of
    a pinned worktree)."""
    return any(a.endswith(b"compare_methods.py") for a in cmdline) or any(
        a == b"-m" and b == b"benchmarks.compare_methods" for a, b in zip(cmdline, cmdline[1:]))


def stop(runs: list[Path], timeout: float, log) -> list[Path]:
    """SIGTERM every run's benchmark driver, then its training process; wait until each lock is free. Returns the
    runs still held after `timeout` seconds."""
    pids = {run: holder(run) for run in runs}
    for run, pid in pids.items():
        if pid is None:
            continue
        driver = parent_benchmark(pid)
        if driver is not None:
            log(f"{run}: SIGTERM to compare_methods.py (PID {driver})")
            os.kill(driver, signal.SIGTERM)
        log(f"{run}: SIGTERM to the training process (PID {pid}); it checkpoints and exits")
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    held = [run for run, pid in pids.items() if pid is not None]
    while held and time.monotonic() < deadline:
        time.sleep(1.0)
        held = [run for run in held if holder(run) is not None]
    return held


def finished_step(run: Path) -> int | None:
    """The step of a run that has finished (its exported pipeline is of its newest checkpoint's step), or None."""
    exported = exported_step(run)
    steps = [checkpoint_step(c) for c in list_checkpoints(run)]
    return exported if steps and exported == max(steps) else None


def newest_valid(run: Path, log) -> Path | None:
    """The checkpoint a resume would load (the newest that verifies: manifest, sizes, sha256), or None."""
    try:
        return find_latest(run, warn=lambda msg: log(f"{run}: {msg}"))
    except ConfigError:  # checkpoints, none valid
        return None


def prune(run: Path, keep: Path, dry_run: bool, log) -> None:
    """Delete every checkpoint of the run but `keep`."""
    for c in list_checkpoints(run):
        if c != keep:
            log(f"{run}: {'would delete' if dry_run else 'deleting'} {c.name}")
            if not dry_run:
                shutil.rmtree(c)


def stage(runs: list[Path], dry_run: bool, log) -> None:
    """`git add -f -A` the run folders (their lock files aside: empty and held by whoever resumes)."""
    cmd = ["git", "add", "-f", "-A", "--", *map(str, runs), *(f":(exclude){r}/.lock" for r in runs)]
    log(("would run: " if dry_run else "") + " ".join(cmd))
    if not dry_run:
        subprocess.run(cmd, check=True, cwd=runs[0])  # the repository that holds the runs


def unstage(runs: list[Path], dry_run: bool, log) -> None:
    """Take each finished run's files out of git's index (they stay on disk): a parked copy of an earlier step would
    make a fresh checkout resume the run from there."""
    for run in runs:
        tracked = subprocess.run(["git", "ls-files", "--", str(run)], cwd=run, capture_output=True, text=True).stdout
        if tracked.strip():
            log(f"{run}: {'would take' if dry_run else 'taking'} its earlier parked copy out of the index "
                "(git rm -r --cached; the files stay)")
            if not dry_run:
                subprocess.run(["git", "rm", "-r", "-q", "--cached", "--", str(run)], cwd=run, check=True)


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, help="run folders, or --work folders holding them")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="seconds to wait for the runs to stop (a 32 px evaluation in progress takes ~6 min)")
    p.add_argument("--no_stop", action="store_true", help="do not signal anything (the runs must already be stopped)")
    p.add_argument("--no_stage", action="store_true", help="prune only; do not git add")
    p.add_argument("--dry_run", action="store_true", help="say what would be done; change nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    log = lambda msg: print(f"park_runs: {msg}", flush=True)  # noqa: E731
    paths = [p.resolve() for p in args.paths]
    missing = [p for p in paths if not p.is_dir()]
    if missing:
        print(f"park_runs: error: not a folder: {missing[0]}", file=sys.stderr)
        return 2
    runs = run_folders(paths)
    if not runs:
        print(f"park_runs: error: no training run in {', '.join(map(str, paths))}", file=sys.stderr)
        return 2
    running = [r for r in runs if holder(r) is not None]
    if running and (args.no_stop or args.dry_run):
        what = "would stop" if args.dry_run else "error: still training (drop --no_stop to stop them)"
        log(f"{what}: {', '.join(str(r) for r in running)}")
        if not args.dry_run:
            return 2
    elif running:
        held = stop(running, args.timeout, log)
        if held:
            print(f"park_runs: error: still training after {args.timeout:.0f} s: {', '.join(map(str, held))}; "
                  "nothing pruned or staged", file=sys.stderr)
            return 1
    finished = {run: step for run in runs if (step := finished_step(run)) is not None}
    for run, step in finished.items():
        log(f"{run}: finished at step {step}: nothing to resume, not parked")
    empty = [run for run in runs if run not in finished and not list_checkpoints(run)]
    for run in empty:
        log(f"{run}: no checkpoint (records only, or not yet at its first one): nothing to park")
    keep = {run: newest_valid(run, log) for run in runs if run not in finished and run not in empty}
    broken = [run for run, c in keep.items() if c is None]
    if broken:
        print(f"park_runs: error: {broken[0]} has no checkpoint that verifies; nothing pruned or staged",
              file=sys.stderr)
        return 1
    for run, c in keep.items():
        prune(run, c, args.dry_run, log)
        log(f"{run}: {'keeps' if args.dry_run else 'parked at'} step {checkpoint_step(c)} ({size_mb(run):.1f} MB)")
    if not args.no_stage:
        unstage(list(finished), args.dry_run, log)
        if keep:
            stage(list(keep), args.dry_run, log)
        if not args.dry_run:
            log("staged; commit them (each park adds its size to the repository's history)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
