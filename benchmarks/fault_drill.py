#!/usr/bin/env python
"""Fault drill: inject every fault category of issues 15 and 30 into the real CLIs and count what came out clean.

    python benchmarks/fault_drill.py                       # about 20 min on a free 2-core CPU
    python benchmarks/fault_drill.py --kills 6 --corruptions 4 --seed 1

Every case is a real process (train_accelerate.py at cpu-tiny16 toy size on generated images with the stateful
`adaptive` sampler, a checkpoint every 4 steps, an export every 8; sample.py, evaluate_fid.py, reconstruct_ema.py).
Categories (benchmarks/drill/):
- SIGKILL + resume, corrupt checkpoint, disk full, divergence (NaN, a finite blow-up, a healthy run): `resume`, `runs`;
- overwrite x signals/failures, non-run folder, branches, SIGHUP / second Ctrl-C, DDP faults: `runs`;
- Hub waits (the push, the pipeline, the data, the reference against an endpoint that accepts and never answers, and
  a SIGTERM during a wait), token / secret echo, bad input and odd output paths per CLI: `inputs`;
- hostile checkpoint contents (files that pass their manifest but hold the wrong things), users' methods that fail
  to import or build: `hostile`.
Each case is counted as clean (behaved as specified), lost (a run's data or a user's file gone or changed), hung (a
process over its time limit) and tracebacks shown to the user. Writes docs/benchmarks/faults/<date>/results.json and
README.md; exit 0 only when every case is clean with nothing lost, no hang and no traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path


from benchmarks.drill import hostile, inputs, report, resume, runs
from benchmarks.drill.harness import EXPORT_EVERY, ROOT, Drill, make_data, state_digest
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs (rotating: training, checkpoint write, export)")
    p.add_argument("--corruptions", type=int, default=2, help="corruptions of the newest checkpoint (rotating kinds)")
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

    # The uninterrupted reference: every resume must end bit-identical to it; copies of it are the finished run.
    straight = args.work / "straight"
    rc, out, hung = d.finish(d.start(straight))
    if rc != 0:
        raise SystemExit(f"the reference run failed:\n{out[-3000:]}")
    reference = state_digest(straight / f"checkpoint-{d.steps}")

    finished = resume.kill_drill(d, args.kills, random.Random(args.seed), reference)
    resume.corruption_drill(d, args.corruptions, finished, reference)
    resume.disk_full_drill(d)
    resume.nan_drill(d)
    runs.blow_up_drill(d, straight, out)
    runs.overwrite_drill(d, straight)
    runs.non_run_drill(d)
    runs.branch_drill(d, straight)
    runs.signal_drill(d)
    runs.ddp_drill(d)
    inputs.hub_drill(d)
    inputs.token_echo_drill(d)
    inputs.bad_input_drill(d, straight)
    hostile.hostile_checkpoint_drill(d, straight)
    hostile.plugin_drill(d)

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    meta = {"date": dt.date.today().isoformat(),
            "command": " ".join(["python", "benchmarks/fault_drill.py", *(argv or sys.argv[1:])]), "commit": commit,
            "torch": torch.__version__, "seconds": time.time() - t0, "load_start": load_start,
            "load_end": "/".join(f"{x:.1f}" for x in os.getloadavg()), "steps": d.steps,
            "run_flags": d.args(Path("RUN"))}
    s = report.write(args.out or ROOT / "docs" / "benchmarks" / "faults" / meta["date"], meta, d.records)
    print(s["total"])
    t = s["total"]
    return 0 if t["lost"] == 0 and t["hangs"] == 0 and t["tracebacks"] == 0 and t["clean"] == t["tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
