"""Issue 57's hostile inputs: checkpoints whose files pass their manifest but hold the wrong things, and users'
methods (`--timestep_sampler pkg.module:Class`) that fail to import or to build. Each: one line on stderr, its exit
status, the run untouched (a checkpoint's bad contents) or never created (a method that fails)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .harness import Drill, one_line, snapshot

HOSTILE = "hostile checkpoint contents"
PLUGINS = "users' method failures"


class Refused:  # a class the weights-only loader refuses to unpickle (never run: no code from a checkpoint runs)
    pass


def spoil(run: Path, kind: str) -> Path:
    """Make `run`'s newest checkpoint hostile in one way, its manifest re-written so that the checksums pass; returns
    the checkpoint."""
    import torch

    from adaptive.checkpoint import list_checkpoints, write_manifest

    ckpt = list_checkpoints(run)[-1]
    step = int(ckpt.name.split("-")[1])
    state = ckpt / "training_state.pt"
    if kind == "training_state.pt: {}":
        torch.save({}, state)
    elif kind == "training_state.pt: wrong types":
        torch.save({"progress": "step 7", "sampler": [1, 2], "ema_num_updates": None}, state)
    elif kind == "training_state.pt: a class the weights-only loader refuses":
        torch.save({"progress": Refused()}, state)
    elif kind == "training_state.pt: not a torch file":
        state.write_bytes(b"PK\x03\x04 not really a zip")
    elif kind == "config.json: []":
        (ckpt / "config.json").write_text("[]")
    elif kind == "config.json: truncated":
        (ckpt / "config.json").write_text('{"seed": 0, "resol')
    elif kind == "model.safetensors: another model's tensors":
        from safetensors.torch import save_file

        save_file({"conv_in.weight": torch.zeros(3, 3, 1, 1)}, str(ckpt / "model.safetensors"))
    else:
        raise ValueError(kind)
    if kind.startswith("config.json"):
        (run / "config.json").unlink()  # the checkpoint's config is the one a resume reads
    write_manifest(ckpt, step)
    return ckpt


KINDS = ("training_state.pt: {}", "training_state.pt: wrong types",
         "training_state.pt: a class the weights-only loader refuses", "training_state.pt: not a torch file",
         "config.json: []", "config.json: truncated", "model.safetensors: another model's tensors")


def hostile_checkpoint_drill(d: Drill, finished: Path, workers: int = 2) -> None:
    """Resume a copy of the finished run from its spoiled newest checkpoint: exit 2, one line naming the file, the
    run as it was. Rows of the wrong shape in stats.jsonl: dropped saying so, the resume goes on."""
    def run(kind: str):
        copy = d.work / "hostile" / kind.split(":")[0].replace(".", "-") / str(KINDS.index(kind))
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(finished, copy)
        ckpt = spoil(copy, kind)
        before = snapshot(copy)
        rc, out, err, hung = d.cli(["train_accelerate.py", *d.args(copy, "--max_train_steps", str(d.steps + 2),
                                                                   "--resume_from_checkpoint", str(ckpt))])
        line = one_line(err)
        named = kind.split(":")[0]
        d.record(HOSTILE, kind, clean=rc == 2 and line is not None and named in line and snapshot(copy) == before,
                 lost=snapshot(copy) != before, hung=hung, outputs=(out, err), exit_status=rc, message=line)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, KINDS))

    copy = d.work / "hostile" / "stats"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(finished, copy)
    with open(copy / "stats.jsonl", "a") as f:
        f.write('[1, 2]\n{"step": "seven"}\n"text"\n')
    rc, out, err, hung = d.cli(["train_accelerate.py", *d.args(copy, "--max_train_steps", str(d.steps + 2),
                                                               "--resume_from_checkpoint", "latest")])
    import json

    rows = [json.loads(line) for line in (copy / "stats.jsonl").read_text().splitlines()]
    d.record(HOSTILE, "stats.jsonl: rows of the wrong shape (dropped, saying so; the resume goes on)",
             clean=rc == 0 and "skipped 3 line(s)" in out and all(isinstance(r.get("step"), int) for r in rows),
             hung=hung, outputs=(out, err), exit_status=rc)


PLUGIN_CASES = {  # case -> (spec, what the line must say)
    "a module that does not exist": ("no_such_pkg.methods:Mine", "cannot import it (ModuleNotFoundError"),
    "a class the module lacks": ("tests.plugins.power_sampler:NoSuchSampler", "cannot import it (AttributeError"),
    "not a TimestepSampler": ("adaptive.config:TrainConfig", "not a TimestepSampler subclass"),
    "its constructor raises": ("tests.plugins.power_sampler:BrokenPowerSampler",
                               "building BrokenPowerSampler failed: RuntimeError"),
    "a module that raises on import": ("benchmarks.drill.raising_module:Anything", "cannot import it (RuntimeError"),
}


def without_method_options(argv: list[str]) -> list[str]:
    """The drill's run flags without `adaptive`'s own options (another method refuses them, before it is built)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("--adaptive_"):
            skip = "=" not in a
        else:
            out.append(a)
    return out


def plugin_drill(d: Drill, workers: int = 2) -> None:
    """--timestep_sampler pkg.module:Class that cannot be used: exit 2, one line naming the flag and the cause,
    nothing created."""
    def run(case: str):
        out_dir = d.work / "plugins" / case.replace(" ", "-")
        shutil.rmtree(out_dir, ignore_errors=True)
        spec, says = PLUGIN_CASES[case]
        argv = without_method_options(d.args(out_dir, "--timestep_sampler", spec))
        rc, out, err, hung = d.cli(["train_accelerate.py", *argv])
        line = one_line(err)
        created = out_dir.exists() and [p.name for p in out_dir.iterdir()] not in ([], [".lock"])
        d.record(PLUGINS, f"{case} ({spec})", clean=rc == 2 and line is not None
                 and f"--timestep_sampler {spec}: {says}" in line and not created,
                 hung=hung, outputs=(out, err), exit_status=rc, message=line)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, PLUGIN_CASES))
