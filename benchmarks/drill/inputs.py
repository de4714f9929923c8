"""Issue 30's input faults: Hub waits on every path against an endpoint that accepts and never answers, token echo in
argparse errors, and a table of bad input per CLI (each: one line on stderr, its exit status, nothing written)."""

from __future__ import annotations

import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .harness import SECRET, Drill, SilentHub, finish_split, one_line, snapshot

HUB = "Hub waits"


def features(path: Path) -> Path:
    """A TorchScript proxy feature network at toy size ([N, 3, H, W] in [0, 255] -> [N, 48])."""
    import torch

    class PooledFeatures(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.adaptive_avg_pool2d(x / 255.0, 4).flatten(1)

    torch.jit.script(PooledFeatures()).save(str(path))
    return path


def scalar_features(path: Path) -> Path:
    """A TorchScript 'feature network' that returns one number per batch, not [N, D] features."""
    import torch

    class Scalar(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean()

    torch.jit.script(Scalar()).save(str(path))
    return path


def hub_drill(d: Drill) -> None:
    """The push, the pipeline, the data and the reference against a silent Hub; a SIGTERM during the data's wait."""
    feat = features(d.work / "feat.pt")
    paths = {
        "push (--push_to_hub, --hub_upload_timeout 10)": ["train_accelerate.py", *d.args(
            d.work / "hub-push", "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "drill/silent",
            "--hub_token", SECRET, "--hub_upload_timeout", "10")],
        "sample.py --model_path owner/name": ["sample.py", "--model_path", "someone/ddpm", "--output_dir",
                                              str(d.work / "hub-samples"), "--num_images", "1"],
        "train_accelerate.py --dataset_name": ["train_accelerate.py", *d.args(
            d.work / "hub-data", "--train_data_dir", "none", "--dataset_name", "someone/data")],
        "evaluate_fid.py --ref_dataset": ["evaluate_fid.py", "--make_ref", "--ref_dataset", "someone/data",
                                          "--feature_extractor", str(feat)],
    }

    def run(case: str):
        hub = SilentHub()
        t0 = time.time()
        rc, out, err, hung = d.cli(paths[case], env=hub.env(d.env, d.work / f"hf-home-{len(case)}"))
        hub.close()
        line = one_line(err)
        pushed = case.startswith("push")
        ok = rc == 2 and line is not None and f"no answer from {'' if pushed else 'the Hub at '}{hub.url}" in line
        d.record(HUB, case, clean=ok, hung=hung, outputs=(out, err), seconds=round(time.time() - t0),
                 exit_status=rc, message=line)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, paths))
    hub = SilentHub()
    proc = d.popen(paths["train_accelerate.py --dataset_name"], env=hub.env(d.env, d.work / "hf-home"))
    asked = hub.connected.wait(300)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    rc, out, err, hung = finish_split(proc, limit=120)
    hub.close()
    line = one_line(err)
    d.record(HUB, "SIGTERM 1 s into the wait for --dataset_name", clean=asked and rc == 143 and line is not None
             and "stopped by SIGTERM" in line, hung=hung, outputs=(out, err), seconds=round(time.time() - t0),
             exit_status=rc, message=line)


TOKEN_FLAGS = [["--hub_t", SECRET], ["--hubtoken", SECRET], [f"--hub_tok={SECRET}"], ["--whatever", SECRET]]
PLAIN = "s3cr3tPlainValue"  # not token-shaped: hidden only because of the flag's name (issue 57)
PLAIN_FLAGS = [["--hubkey", PLAIN], ["--api_key", PLAIN], [f"--db_password={PLAIN}"]]
CLI_BASE = {"train_accelerate.py": [], "sample.py": ["--model_path", "m", "--output_dir", "o"],
            "evaluate_fid.py": ["--samples", "s"], "reconstruct_ema.py": ["--run_dir", "r", "--sigma_rel", "0.1"]}


def token_echo_drill(d: Drill) -> None:
    """A misspelled or unknown token flag: refused (exit 2, one line) without the token in any output."""
    cases = [(script, base, spelling) for script, base in CLI_BASE.items()
             for spelling in (TOKEN_FLAGS[:2] if script != "sample.py" else [["--hub_token", SECRET], TOKEN_FLAGS[2]])
             + PLAIN_FLAGS]

    def run(case):
        script, base, spelling = case
        secret = SECRET if SECRET in "".join(spelling) else PLAIN
        rc, out, err, hung = d.cli([script, *base, *spelling])
        d.record("token echo", f"{script} {spelling[0].split('=')[0]} {secret[:5]}...", clean=rc == 2 and
                 one_line(err) is not None and secret not in out + err, hung=hung, outputs=(out, err))

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, cases))


def bad_inputs(d: Drill, finished: Path) -> list[tuple[str, str, list[str], int, Path | None]]:
    """(category, case, argv, expected exit status, folder that must stay as it was or not be created)."""
    w, feat, snaps, garbled, truncated = bad_input_files(d)
    return [*bad_training_inputs(d, finished, w, feat), *bad_scoring_inputs(d, finished, w, feat),
            *bad_reconstruction_inputs(finished, w, snaps, garbled, truncated)]


def bad_input_files(d: Drill):
    """The files the bad inputs point at: (work folder, feature network, a run with snapshots, its copy with a garbled
    config.json, its copy with a truncated snapshot)."""
    w, feat = d.work / "bad", d.work / "feat.pt"
    shutil.rmtree(w, ignore_errors=True)
    (w / "no-run").mkdir(parents=True)
    (w / "a-file").write_text("x")
    snaps = d.work / "snap-run"  # a short run with post-hoc EMA snapshots, damaged copies of it below
    garbled, truncated = w / "garbled-config", w / "truncated-snapshot"
    for copy in (garbled, truncated):
        shutil.copytree(snaps, copy)
    (garbled / "config.json").write_text("{not json")
    victim = sorted((truncated / "ema_snapshots").iterdir())[-1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return w, feat, snaps, garbled, truncated


def bad_training_inputs(d: Drill, finished: Path, w: Path, feat: Path) -> list:
    train, long_name = "bad input: train_accelerate.py", "x" * 300
    t = lambda out, *extra: ["train_accelerate.py", *d.args(out, *extra)]  # noqa: E731
    return [
        (train, "--learning_rate inf", t(w / "t1", "--learning_rate", "inf"), 2, w / "t1"),
        (train, "an output path name over 255 bytes", t(w / long_name), 2, None),
        (train, "--output_dir is a file", t(w / "a-file"), 2, w / "a-file"),
        (train, "--train_data_dir missing", t(w / "t2", "--train_data_dir", str(w / "missing")), 2, w / "t2"),
        (train, "--eval_ref_dir missing", t(w / "t3", "--eval_steps", "1", "--eval_feature_extractor", str(feat),
                                             "--eval_ref_dir", str(w / "missing")), 2, w / "t3"),
        (train, "--resume_from_checkpoint of another folder's missing checkpoint",
         t(w / "t4", "--resume_from_checkpoint", str(w / "missing" / "checkpoint-3")), 2, w / "t4"),
        (train, "--train_batch_size 0", t(w / "t5", "--train_batch_size", "0"), 2, w / "t5"),
        (train, "a run folder without --resume_from_checkpoint", t(finished), 2, finished),
        (train, "--output_dir in /proc (root passes the permission check)", t(Path("/proc/drill-run")), 2, None),
        (train, "--logging_dir in /proc", t(w / "t6", "--logging_dir", "/proc/drill-logs"), 2, w / "t6"),
    ]


def bad_scoring_inputs(d: Drill, finished: Path, w: Path, feat: Path) -> list:
    return [
        ("bad input: sample.py", "--model_path ./missing", ["sample.py", "--model_path", str(w / "missing"),
                                                            "--output_dir", str(w / "s1")], 2, w / "s1"),
        ("bad input: sample.py", "--model_path a folder without a run", ["sample.py", "--model_path",
                                                                         str(w / "no-run"), "--output_dir",
                                                                         str(w / "s2")], 2, w / "s2"),
        ("bad input: sample.py", "--output_dir is a file", ["sample.py", "--model_path", str(finished),
                                                            "--output_dir", str(w / "a-file")], 2, w / "a-file"),
        ("bad input: sample.py", "--num_images 0", ["sample.py", "--model_path", str(finished), "--output_dir",
                                                    str(w / "s3"), "--num_images", "0"], 2, w / "s3"),
        ("bad input: evaluate_fid.py", "--samples missing", ["evaluate_fid.py", "--samples", str(w / "missing"),
                                                             "--feature_extractor", str(feat), "--ref_dir",
                                                             str(d.data)], 2, None),
        ("bad input: evaluate_fid.py", "--output is a folder", ["evaluate_fid.py", "--samples", str(d.data),
                                                                "--feature_extractor", str(feat), "--ref_dir",
                                                                str(d.data), "--output", str(w / "no-run")],
         2, w / "no-run"),
        ("bad input: evaluate_fid.py", "--num_images 2 (scored, no precision/recall)",
         ["evaluate_fid.py", "--samples", str(d.data), "--feature_extractor", str(feat), "--ref_dir", str(d.data),
          "--num_images", "2", "--output", str(w / "m2.json")], 0, None),
        ("bad input: evaluate_fid.py", "--make_ref without a reference", ["evaluate_fid.py", "--make_ref"], 2, None),
        ("bad input: sample.py", "--output_dir in /proc", ["sample.py", "--model_path", str(finished),
                                                           "--output_dir", "/proc/drill-samples"], 2, None),
        ("bad input: sample.py", "--output_dir /dev/null", ["sample.py", "--model_path", str(finished),
                                                            "--output_dir", "/dev/null"], 2, None),
        ("bad input: evaluate_fid.py", "--output in /proc", ["evaluate_fid.py", "--samples", str(d.data),
                                                             "--feature_extractor", str(feat), "--ref_dir",
                                                             str(d.data), "--output", "/proc/drill.json"], 2, None),
        ("bad input: evaluate_fid.py", "a feature network that returns a scalar",
         ["evaluate_fid.py", "--samples", str(d.data), "--feature_extractor", str(scalar_features(w / "scalar.pt")),
          "--ref_dir", str(d.data), "--num_images", "4", "--output", str(w / "m3.json")], 2, None),
    ]


def bad_reconstruction_inputs(finished: Path, w: Path, snaps: Path, garbled: Path, truncated: Path) -> list:
    return [
        ("bad input: reconstruct_ema.py", "--output_dir in /proc", ["reconstruct_ema.py", "--run_dir", str(snaps),
                                                                    "--sigma_rel", "0.1", "--output_dir",
                                                                    "/proc/drill-ema"], 2, None),
        ("bad input: reconstruct_ema.py", "a run without snapshots", ["reconstruct_ema.py", "--run_dir",
                                                                      str(finished), "--sigma_rel", "0.1"],
         2, finished),
        ("bad input: reconstruct_ema.py", "--output_dir is a file", ["reconstruct_ema.py", "--run_dir", str(snaps),
                                                                     "--sigma_rel", "0.1", "--output_dir",
                                                                     str(w / "a-file")], 2, w / "a-file"),
        ("bad input: reconstruct_ema.py", "--sigma_rel 0.5", ["reconstruct_ema.py", "--run_dir", str(snaps),
                                                              "--sigma_rel", "0.5"], 2, snaps),
        ("bad input: reconstruct_ema.py", "config.json not JSON", ["reconstruct_ema.py", "--run_dir", str(garbled),
                                                                   "--sigma_rel", "0.1", "--output_dir",
                                                                   str(w / "r1")], 2, w / "r1"),
        ("bad input: reconstruct_ema.py", "a truncated snapshot", ["reconstruct_ema.py", "--run_dir",
                                                                   str(truncated), "--sigma_rel", "0.1",
                                                                   "--output_dir", str(w / "r2")], 2, w / "r2"),
    ]


def state(path: Path | None):
    """What must not change: a folder's snapshot, a file's bytes, or whether the path exists at all (a new folder
    holding only the lock that training takes before its last checks counts as none)."""
    if path is None or not path.exists() or (path.is_dir() and [p.name for p in path.iterdir()] == [".lock"]):
        return None
    return snapshot(path) if path.is_dir() else path.read_bytes()


def bad_input_drill(d: Drill, finished: Path, workers: int = 2) -> None:
    """Every bad input of `bad_inputs`: its exit status, one stderr line (none for a success), nothing written."""
    d.finish(d.start(d.work / "snap-run", "--max_train_steps", "4", "--ema_snapshots", "0.05", "0.10",
                     "--ema_snapshot_steps", "2"))
    features(d.work / "feat.pt")
    cases = bad_inputs(d, finished)

    def run(case):
        category, name, argv, expected, folder = case
        before = state(folder)
        rc, out, err, hung = d.cli(argv)
        after = state(folder)
        line = one_line(err)
        ok = rc == expected and (line is not None if expected else "Traceback" not in err) and after == before
        d.record(category, name, clean=ok, lost=before is not None and after != before, hung=hung,
                 outputs=(out, err), exit_status=rc, message=line if expected else None)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, cases))
