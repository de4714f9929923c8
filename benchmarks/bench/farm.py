"""The training runs of a methods table: one `train_accelerate.py` process per (method, seed), `parallel` at a time,
each resumed from its checkpoint when the benchmark starts again; finished runs are skipped, and their records are
kept beside the table (out/runs/) so that a lost work folder costs no finished run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from adaptive.checkpoint import checkpoint_step, list_checkpoints
from adaptive.rundir import run_holds_training

from .protocol import plan, used_ratio, variants
from .provenance import ROOT, dirty, git, machine
from .summary import complete

RUN_RECORDS = ("stats.jsonl", "provenance.json", "run_info.json")  # what a finished run is skipped and reported from
SEGMENTS = "segments.jsonl"  # one line per launch of a run: when, from which step, on which machine, at which commit


def run_dir(work: Path, method: str, seed: int) -> Path:
    return work / f"{method}_seed{seed}"


def train_command(method: str, seed: int, out: Path, steps: int, evals: list[int], args) -> list[str]:
    """The train_accelerate.py command of one run (resumes from its latest checkpoint)."""
    flags = variants(args.tuned)[method][1]
    cmd = [sys.executable, str(ROOT / "train_accelerate.py"), "--preset", args.preset, "--train_data_dir",
           str(args.data), "--output_dir", str(out), "--seed", str(seed), "--logger", "none", "--max_train_steps",
           str(steps), "--eval_at_steps", ",".join(map(str, evals)), "--eval_feature_extractor",
           str(args.feature_extractor), "--checkpointing_steps", str(args.checkpointing_steps),
           "--checkpoints_total_limit", "1", "--save_images_steps", str(max(evals)), "--resume_from_checkpoint",
           "latest", *args.extra, *flags]
    if args.mode == "wallclock":
        cmd += ["--max_train_minutes", str(args.budget_minutes)]
    return cmd


def read_run(out: Path) -> dict:
    """A run folder's evaluations (step, FD, training seconds) and the last step it logged."""
    stats = out / "stats.jsonl"
    recs = [json.loads(line) for line in stats.read_text().splitlines()] if stats.exists() else []
    evals = [r for r in recs if "proxy_fd" in r or "fid" in r]
    steps = max((r["step"] for r in recs), default=0)
    return {"evals": [{"step": r["step"], "fd": r.get("proxy_fd", r.get("fid")), "train_seconds": r["train_seconds"]}
                      for r in evals], "steps": steps}


def keep_finished_run(d: Path, out: Path) -> None:
    """A finished run's records next to the table, as out/runs/<method>_seed<k>.<file> (committed with it), so that a
    lost work folder costs no finished run (restore_finished_run copies them back). A run stopped before its last
    planned evaluation (SIGTERM also exits 0) is not kept."""
    prov = d / "provenance.json"
    if not prov.exists() or not complete({**read_run(d), "eval_steps": json.loads(prov.read_text())["eval_steps"]}):
        return
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for f in (*RUN_RECORDS, SEGMENTS):
        if (d / f).is_file():
            shutil.copyfile(d / f, out / "runs" / f"{d.name}.{f}")


def restore_finished_run(d: Path, out: Path) -> bool:
    """Copy a kept run's records back into a work folder that has lost them; True if it did."""
    kept = [out / "runs" / f"{d.name}.{f}" for f in RUN_RECORDS]
    if (d / "stats.jsonl").exists() or not all(k.is_file() for k in kept):
        return False
    d.mkdir(parents=True, exist_ok=True)
    for f, k in zip(RUN_RECORDS, kept):
        shutil.copyfile(k, d / f)
    if (out / "runs" / f"{d.name}.{SEGMENTS}").is_file():  # runs kept before segments were recorded have none
        shutil.copyfile(out / "runs" / f"{d.name}.{SEGMENTS}", d / SEGMENTS)
    return True


def record_segment(d: Path) -> None:
    """Append this launch of the run in `d` to its segments.jsonl: a run resumed on another host (or commit) says
    which of its steps ran where, since its train_seconds mix the hosts' speeds."""
    ckpts = list_checkpoints(d)  # it resumes from the newest that verifies (train_accelerate.py)
    rec = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "from_step": checkpoint_step(ckpts[-1]) if ckpts else 0,
           "machine": machine(), "git_commit": git("rev-parse", "HEAD")}
    with open(d / SEGMENTS, "a") as f:
        f.write(json.dumps(rec) + "\n")


def run_hosts(d: Path) -> list[dict]:
    """The run's segments as (first step, CPU) in launch order; [] for a run started before segments were recorded."""
    seg = d / SEGMENTS
    recs = [json.loads(line) for line in seg.read_text().splitlines() if line.strip()] if seg.is_file() else []
    return [{"from_step": r["from_step"], "cpu": r["machine"]["cpu"]} for r in recs]


def keep_run_logs(rows: list[dict], work: Path, out: Path) -> None:
    """Each finished run's stats.jsonl (losses, gradient norms, per-bin diagnostics, evaluations) next to the table,
    as out/runs/<method>_seed<k>.stats.jsonl: the logs the write-ups cite."""
    for r in rows:
        src = run_dir(work, r["method"], r["seed"]) / "stats.jsonl"
        if complete(r) and src.is_file():
            (out / "runs").mkdir(exist_ok=True)
            shutil.copyfile(src, out / "runs" / f"{r['method']}_seed{r['seed']}.stats.jsonl")


def pending_jobs(pl, base: dict, costs: dict, args, out: Path, this_hash: str, log) -> list[tuple]:
    """(method, seed, command, folder) of every run without all its planned evaluations, seed-major (a complete
    one-seed table first); each new run folder gets its provenance.json (not with --report_only)."""
    jobs = []
    for seed in pl.seeds:
        for m in pl.methods:
            ratio = used_ratio(costs.get(base[m], {}))
            steps, evals = plan(m, ratio, pl.budget, pl.points)
            d = run_dir(args.work, m, seed)
            if restore_finished_run(d, out):
                log(f"restored the finished run {d.name} from {out / 'runs'}")
            if {e["step"] for e in read_run(d)["evals"]} >= set(evals):
                continue
            if not args.report_only:
                write_provenance(d, this_hash, ratio, steps, evals, log)
            jobs.append((m, seed, train_command(m, seed, d, steps, evals, args), d))
    return jobs


def write_provenance(d: Path, this_hash: str, ratio: float, steps: int, evals: list[int], log) -> None:
    """A new run folder's provenance.json (code hash, commit, plan); a warning for a run started with other code."""
    d.mkdir(parents=True, exist_ok=True)
    prov = d / "provenance.json"
    if prov.exists() and json.loads(prov.read_text()).get("code_hash") != this_hash:
        log(f"warning: {d} was started with other code; it continues, and its row will say so")
    elif not prov.exists():
        prov.write_text(json.dumps({"code_hash": this_hash, "git_commit": git("rev-parse", "HEAD"),
                                    "cost_ratio": ratio, "planned_steps": steps, "eval_steps": evals}))


def run_all(jobs: list[tuple[str, int, list[str], Path]], parallel: int, threads: int, log, on_done=None) -> None:
    """Run the training commands `parallel` at a time; logs go to <run>/benchmark.log; on_done(run folder) after each
    run that exits 0."""
    pending, running = list(jobs), []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    while pending or running:
        while pending and len(running) < parallel:
            name, seed, cmd, out = pending.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            if not run_holds_training(out):  # its provenance.json and log are not a run's: train beside them
                cmd = [*cmd, "--overwrite_output_dir"]
            logf = open(out / "benchmark.log", "a")
            record_segment(out)
            log(f"start {name} seed {seed}: {out}")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
            running.append((name, seed, proc, logf, out))
        time.sleep(2)
        for item in list(running):
            name, seed, proc, logf, out = item
            if proc.poll() is not None:
                logf.close()
                running.remove(item)
                log(f"{'done' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} {name} seed {seed}")
                if proc.returncode == 0 and on_done is not None:
                    on_done(out)


def hosts_field(d: Path) -> dict:
    """{"hosts": the run's segments} for a run that recorded them, else {} (older tables re-render unchanged)."""
    hosts = run_hosts(d)
    return {"hosts": hosts} if hosts else {}


def collect_rows(pl, base: dict, costs: dict, args, previous: dict, this_hash: str) -> tuple[dict, list[str]]:
    """The table's rows, (method, seed) -> row: earlier invocations' (results.json) and every run folder's, if they
    share this code; and the runs left out because they were measured with other code."""
    old = previous.get("rows", [])
    rows = {(r["method"], r["seed"]): r for r in old if r.get("code_hash") == this_hash}
    excluded = [f"{r['method']}/seed{r['seed']} ({r.get('git_commit', '?')[:8]})" for r in old
                if r.get("code_hash") != this_hash]
    commit, is_dirty = git("rev-parse", "HEAD"), dirty()
    for m in pl.methods:
        cost = costs.get(base[m], {})
        steps, evals = plan(m, used_ratio(cost), pl.budget, pl.points)
        for seed in pl.seeds:
            d = run_dir(args.work, m, seed)
            r = read_run(d)
            if not r["evals"]:
                continue
            info = json.loads((d / "run_info.json").read_text()) if (d / "run_info.json").exists() else {}
            prov = json.loads((d / "provenance.json").read_text()) if (d / "provenance.json").exists() else {}
            rows[(m, seed)] = {"method": m, "seed": seed, "cost_ratio": cost.get("cost_ratio", 1.0),
                               "cost_ratio_used": used_ratio(cost), "planned_steps": steps, "eval_steps": evals, **r,
                               "git_commit": prov.get("git_commit", commit),
                               "code_hash": prov.get("code_hash", this_hash), "dirty": is_dirty,
                               "command": " ".join(train_command(m, seed, d, steps, evals, args)),
                               "run_git_commit": info.get("git_commit"), **hosts_field(d)}
    for key, r in list(rows.items()):
        if r["code_hash"] != this_hash:
            excluded.append(f"{r['method']}/seed{r['seed']} ({r['git_commit'][:8]})")
            del rows[key]
    return rows, excluded
