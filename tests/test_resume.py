"""Never lose training: exact resume (1 and 2 ranks), SIGTERM, SIGKILL anywhere, corrupt checkpoints, export, Hub."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from adaptive.checkpoint import MANIFEST, load_ema_weights, load_object_state, verify_checkpoint

from conftest import ROOT, run_cli, tiny_args

pytestmark = pytest.mark.slow

# --adaptive_balance 0.5: an objective that anneals with the run (the default, 0, has none to carry over)
STATEFUL = ["--timestep_sampler", "adaptive", "--adaptive_warmup_steps", "2", "--adaptive_balance", "0.5",
            "--logging_steps", "1", "--save_images_steps", "none", "--lr_warmup_steps", "2"]


def same_state(a: Path, b: Path) -> None:
    """Parameters, optimizer, EMA and timestep-sampler state bit-identical."""
    for ta, tb in ((load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))),
                   (load_ema_weights(a), load_ema_weights(b))):
        assert ta.keys() == tb.keys()
        for k in ta:
            assert torch.equal(ta[k], tb[k]), k
    sa, sb = load_object_state(a / "training_state.pt"), load_object_state(b / "training_state.pt")
    for k in ("m1", "m2", "hits"):
        assert torch.equal(sa["sampler"][k], sb["sampler"][k]), k
    assert sa["progress"]["step"] == sb["progress"]["step"] and sa["ema_num_updates"] == sb["ema_num_updates"]
    oa = torch.load(a / "optimizer.bin", weights_only=True)["state"]
    ob = torch.load(b / "optimizer.bin", weights_only=True)["state"]
    for k in oa:
        assert torch.equal(oa[k]["exp_avg_sq"], ob[k]["exp_avg_sq"])


# N steps, stop, resume to N+M with a larger --max_train_steps: exact only for schedules that do not depend on the
# horizon, so the adaptive balance is held constant here (its default anneals with steps/max_train_steps, like a
# cosine LR schedule; the same-command resume of the default is covered by the SIGTERM and SIGKILL tests below).
CONSTANT_HORIZON = [*STATEFUL, "--adaptive_balance_final", "none"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_exact_resume_is_bit_identical(tmp_path, image_folder, nproc):
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_cli("train_accelerate.py", tiny_args(image_folder, straight, *CONSTANT_HORIZON, "--max_train_steps", "6",
                                             "--checkpointing_steps", "3"), nproc=nproc)
    run_cli("train_accelerate.py", tiny_args(image_folder, split, *CONSTANT_HORIZON, "--max_train_steps", "3",
                                             "--checkpointing_steps", "3"), nproc=nproc)
    proc = run_cli("train_accelerate.py", tiny_args(image_folder, split, *CONSTANT_HORIZON, "--max_train_steps", "6",
                                                    "--checkpointing_steps", "3", "--resume_from_checkpoint", "latest"),
                   nproc=nproc)
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout
    same_state(straight / "checkpoint-6", split / "checkpoint-6")
    same_state(straight / "checkpoint-3", split / "checkpoint-3")
    # the run log of the resumed run matches the straight one (records after the resume point were rewritten)
    recs = lambda d: [(r["step"], r["loss"])  # noqa: E731
                      for r in map(json.loads, (d / "stats.jsonl").read_text().splitlines()) if "loss" in r]
    assert recs(split) == recs(straight)
    if nproc == 2:
        names = {p.name for p in (split / "checkpoint-6").iterdir()}
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= names


def start(args: list[str], checkpoint_pause: float | None = None) -> subprocess.Popen:
    """train_accelerate.py in the background; with checkpoint_pause, through the test helper whose checkpoint writes
    pause that long before the manifest (a wide window for a kill)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    script = ["train_accelerate.py"] if checkpoint_pause is None else \
        ["-m", "tests.helpers.slow_checkpoint_train", str(checkpoint_pause)]
    return subprocess.Popen([sys.executable, *script, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    t0 = time.time()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.stdout.read()[-3000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError("timed out")
        time.sleep(0.05)


def last_step(run: Path) -> int:
    f = run / "stats.jsonl"
    if not f.exists():
        return 0
    steps = [json.loads(l)["step"] for l in f.read_text().splitlines() if l.strip().endswith("}")]
    return max(steps, default=0)


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_zero(tmp_path, image_folder):
    run = tmp_path / "run"
    args = tiny_args(image_folder, run, *STATEFUL, "--max_train_steps", "100000", "--checkpointing_steps", "100000")
    proc = start(args)
    wait_for(lambda: last_step(run) >= 3, proc=proc)
    seen = last_step(run)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    assert time.time() - t0 < 20
    ckpts = sorted(run.glob("checkpoint-*"))
    assert len(ckpts) == 1 and verify_checkpoint(ckpts[0]) is None
    step = int(ckpts[0].name.split("-")[1])
    assert seen <= step <= seen + 3  # finished the step in flight (logging lags by at most a step or two)
    assert f"stopping after step {step}: received SIGTERM" in out
    assert not (run / "model_index.json").exists()  # preempted: no export, just the checkpoint
    proc2 = run_cli("train_accelerate.py", args[:args.index("--max_train_steps")] + STATEFUL +
                    ["--max_train_steps", str(step + 2), "--checkpointing_steps", "100000",
                     "--resume_from_checkpoint", "latest"])
    assert f"at step {step}" in proc2.stdout and (run / f"checkpoint-{step + 2}").is_dir()


def test_sigkill_at_random_points_then_resume_matches_the_straight_run(tmp_path, image_folder):
    steps = ["--max_train_steps", "10", "--checkpointing_steps", "2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_cli("train_accelerate.py", tiny_args(image_folder, straight, *STATEFUL, *steps))
    args = tiny_args(image_folder, killed, *STATEFUL, *steps, "--resume_from_checkpoint", "latest")
    rng = random.Random(1234)
    # 1) kill while a checkpoint is half written (the helper widens the window between write and manifest)
    proc = start(args, checkpoint_pause=30)
    wait_for(lambda: any(killed.glob(".checkpoint-*.tmp")), proc=proc)
    proc.kill()
    proc.wait()
    partial = next(killed.glob(".checkpoint-*.tmp"))
    assert not any(killed.glob("checkpoint-*"))  # nothing that looks like a valid checkpoint
    # 2) kills at random moments (start-up, training, checkpointing)
    for _ in range(3):
        proc = start(args)
        wait_for(lambda: last_step(killed) >= 1 or proc.poll() is not None, proc=None)
        time.sleep(rng.uniform(0.0, 2.0))
        proc.kill()
        proc.wait()
    # 3) a checkpoint corrupted on disk is skipped with a warning
    ckpts = sorted(killed.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if ckpts:
        newest = ckpts[-1]
        (newest / "model.safetensors").write_bytes(b"\0" * (newest / "model.safetensors").stat().st_size)
    proc = run_cli("train_accelerate.py", args)
    if ckpts:
        assert f"warning: skipping {newest.name}: model.safetensors is corrupt" in proc.stdout
    assert "done:" in proc.stdout
    same_state(straight / "checkpoint-10", killed / "checkpoint-10")
    assert not partial.exists() or partial.name.startswith(".")


def test_explicit_corrupt_or_partial_checkpoint_is_refused(tmp_path, image_folder):
    run = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, run, *STATEFUL, "--max_train_steps", "2",
                                             "--checkpointing_steps", "2"))
    (run / "checkpoint-2" / MANIFEST).unlink()
    proc = run_cli("train_accelerate.py", tiny_args(image_folder, run, *STATEFUL, "--max_train_steps", "4",
                                                    "--resume_from_checkpoint", str(run / "checkpoint-2")), check=False)
    assert proc.returncode == 2
    assert "is not a valid checkpoint: no manifest.json (incomplete write)" in proc.stderr.strip().splitlines()[-1]


def test_checkpoints_total_limit_keeps_the_newest(tmp_path, image_folder):
    run = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, run, *STATEFUL, "--max_train_steps", "5",
                                             "--checkpointing_steps", "1", "--checkpoints_total_limit", "2"))
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]
    assert not any(run.glob(".checkpoint-*"))


def test_export_round_trip_through_ddpm_pipeline(tmp_path, image_folder):
    from diffusers import DDPMPipeline

    run = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, run, "--max_train_steps", "3",
                                             "--save_images_steps", "none"))
    pipe = DDPMPipeline.from_pretrained(run)
    assert (run / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    ema = load_ema_weights(run / "checkpoint-3")
    for k, v in pipe.unet.state_dict().items():
        assert torch.equal(v, ema[k]), k  # the exported U-Net is the EMA
    images = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0),
                  output_type="np").images
    assert images.shape == (2, 16, 16, 3) and images.min() >= 0 and images.max() <= 1
    from huggingface_hub import ModelCard

    card = ModelCard.load(run / "README.md")
    assert card.data.library_name == "diffusers"
    assert "| timestep sampler, loss weighting | uniform, none |" in card.text
    assert "| optimizer steps | 3 x batch 4 = 12 images |" in card.text
    assert re.search(r"\| training wall-clock \| \d+ s on 1 x CPU \|", card.text)  # seconds for a short run
    snippet = card.text.split("```python\n", 1)[1].split("```", 1)[0]
    assert f'from_pretrained("{run}")' in snippet  # not pushed: the folder itself
    scope: dict = {}
    exec(snippet, scope)  # the card's usage snippet, run as a reader would
    assert len(scope["images"]) == 16 and scope["images"][0].size == (16, 16)


HUB_ENV = {"HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def test_hub_push_end_to_end_with_retry_and_no_token_anywhere(tmp_path, image_folder):
    from huggingface_hub import ModelCard

    from conftest import write_pooled_features
    from test_hub import FakeHub

    hub = FakeHub().start()
    hub.fail_commits, hub.fail_status = 1, 409  # the first commit fails; the uploader retries
    token = "hf_SecretTokenValue0123456789"
    run = tmp_path / "run"
    feats = write_pooled_features(tmp_path / "feat.pt")  # a local path in the config; only its name may go up
    try:
        proc = run_cli("train_accelerate.py", tiny_args(
            image_folder, run, "--max_train_steps", "2", "--checkpointing_steps", "1", "--push_to_hub",
            "--hub_model_id", "someone/tiny-ddpm", "--hub_token", token, "--hub_private_repo",
            "--eval_feature_extractor", str(feats)),
            env={**HUB_ENV, "HF_ENDPOINT": hub.endpoint})
    finally:
        hub.stop()
    assert "retrying" in proc.stdout and "hub: pushed" in proc.stdout
    assert hub.repos["someone/tiny-ddpm"]["private"] is True
    assert hub.repos["someone/tiny-ddpm"]["authorization"] == f"Bearer {token}"
    files = hub.commits[-1]["files"]
    expected = {"model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
                "scheduler/scheduler_config.json", "README.md", "config.json", "timestep_p.png",
                "samples/grid_0000002.png"}
    assert set(files) == expected
    assert not any(f.startswith("checkpoint") for c in hub.commits for f in c["files"])
    for p in run.rglob("*"):
        if p.is_file():
            assert token.encode() not in p.read_bytes(), p
    assert token not in proc.stdout + proc.stderr

    # Nothing uploaded names a local path (issue 15.10); the local config keeps them for resuming.
    local_roots = {str(tmp_path), str(image_folder.parent), str(Path(tmp_path).resolve().parents[1])}
    for rel, data in files.items():
        for root in local_roots:
            assert root.encode() not in data, (rel, root)
    public = json.loads(files["config.json"])
    assert (public["output_dir"], public["train_data_dir"], public["eval_feature_extractor"]) == (
        ".", image_folder.name, "feat.pt")
    assert json.loads((run / "config.json").read_text())["train_data_dir"] == str(image_folder)
    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "diffusers" and "ddpm" in card.data.tags
    assert 'DDPMPipeline.from_pretrained("someone/tiny-ddpm")' in card.text
    assert "| training wall-clock |" in card.text and " on 1 x CPU |" in card.text


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_bad_hub_token_stops_every_rank_before_the_first_step(tmp_path, image_folder, nproc):
    """Issue 16.7: the token and the repo are checked before anything is built or written; every rank exits."""
    from test_hub import FakeHub

    hub = FakeHub().start()
    hub.tokens = {"hf_GoodTokenValue0123456789abcdef": {"name": "someone", "orgs": [], "auth": {}}}
    run = tmp_path / "run"
    t0 = time.perf_counter()
    try:
        proc = run_cli("train_accelerate.py", tiny_args(
            image_folder, run, "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "someone/tiny-ddpm"),
            nproc=nproc, timeout=300, check=False,
            env={**HUB_ENV, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_BadTokenValue0123456789abcdef"})
    finally:
        hub.stop()
    assert proc.returncode != 0 and time.perf_counter() - t0 < 240
    if nproc == 1:
        assert proc.returncode == 2
    message = ("train_accelerate.py: error: --push_to_hub to someone/tiny-ddpm: checking the token failed: the Hub "
               "rejected the token from HF_TOKEN (401 Unauthorized)")
    assert message in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith(message)]
    assert len(said) == 1  # every rank stops (none hangs); the launcher's rank 0 says it once
    if nproc > 1:  # and torchrun's failure summary shows the line, not "To enable traceback see: ..." (issue 56)
        assert f"traceback : {message}" in proc.stderr and "To enable traceback" not in proc.stderr
    assert not run.exists()  # nothing written
    assert hub.repos == {} and hub.commits == []
    assert "hf_BadTokenValue" not in proc.stdout + proc.stderr


def test_a_failed_final_upload_keeps_the_run_exits_3_and_the_printed_command_retries_it(tmp_path, image_folder):
    """Issue 16.8: the commit fails after every retry -> everything stays local, the rerun command is printed, exit 3;
    running that command once the Hub works uploads the finished run without training."""
    import shlex

    from test_hub import FakeHub

    hub = FakeHub().start()
    hub.fail_commits, hub.fail_status = 10**6, 409  # not retried by huggingface_hub; 3 attempts by the uploader
    run = tmp_path / "run"
    env = {**HUB_ENV, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_SecretTokenValue0123456789"}
    try:
        proc = run_cli("train_accelerate.py", tiny_args(
            image_folder, run, "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "someone/tiny-ddpm",
            "--overwrite_output_dir"), env=env, check=False)
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]  # adaptive.hub.EXIT_UPLOAD_FAILED
        assert hub.commits == []
        assert json.loads((run / "export.json").read_text())["step"] == 2  # trained and exported locally
        assert (run / "unet" / "diffusion_pytorch_model.safetensors").exists() and list(run.glob("checkpoint-2"))
        [line] = [x for x in proc.stdout.splitlines() if x.startswith("hub: NOT uploaded to someone/tiny-ddpm: ")]
        assert "'final pipeline at step 2' (failed after 3 attempts: " in line
        assert f"Everything is kept in {run.resolve()}. To retry the upload, run: python train_accelerate.py " in line
        command = shlex.split(line.split("To retry the upload, run: ", 1)[1])
        assert command[-2:] == ["--resume_from_checkpoint", "latest"] and "--overwrite_output_dir" not in command

        hub.fail_commits = 0
        files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "README.md"}
        retry = run_cli(command[1], command[2:], env=env)
    finally:
        hub.stop()
    assert "nothing to train: step 2 of --max_train_steps 2 reached" in retry.stdout
    assert "hub: pushed" in retry.stdout and "NOT uploaded" not in retry.stdout
    assert [c["summary"] for c in hub.commits] == ["final pipeline at step 2"]
    assert 'DDPMPipeline.from_pretrained("someone/tiny-ddpm")' in hub.commits[0]["files"]["README.md"].decode()
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "README.md"} == files


def test_a_silent_hub_does_not_keep_a_finished_run_alive(tmp_path, image_folder):
    """Issue 15.6: the upload endpoint accepts the connection and never answers; the finished run still exits about
    --hub_upload_timeout seconds after it starts waiting, with exit 3 and the message."""
    from test_hub import FakeHub

    hub = FakeHub().start()
    hub.hang = {"preupload", "commit"}
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **HUB_ENV, "HF_ENDPOINT": hub.endpoint,
           "HF_TOKEN": "hf_SecretTokenValue0123456789"}
    cmd = [sys.executable, "train_accelerate.py", *tiny_args(
        image_folder, run, "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "someone/tiny-ddpm",
        "--hub_upload_timeout", "3")]
    lines = []
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(600, proc.kill)  # a run that never exits fails the test instead of hanging it
    watchdog.start()
    try:
        waiting = None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("hub: waiting for the upload"):
                waiting = time.perf_counter()
        rc = proc.wait()
        exited = time.perf_counter()
    finally:
        watchdog.cancel()
        proc.kill()
        hub.stop()
    out = "".join(lines)
    assert waiting is not None, out[-3000:]
    assert rc == 3, out[-3000:]
    assert exited - waiting < 3 + 20, (exited - waiting, out[-3000:])  # 3 s wait, then teardown on a loaded CPU
    assert "hub: NOT uploaded to someone/tiny-ddpm: 'final pipeline at step 2' (still uploading)" in out
    assert json.loads((run / "export.json").read_text())["step"] == 2


def test_rerunning_a_finished_run_changes_nothing_and_a_larger_budget_continues_it(tmp_path, image_folder):
    """The same command again: nothing retrained, re-exported or rewritten; with more steps it resumes."""
    out = tmp_path / "run"
    args = tiny_args(image_folder, out, *STATEFUL, "--max_train_steps", "3", "--resume_from_checkpoint", "latest")
    first = run_cli("train_accelerate.py", args)
    assert f"no checkpoint in {out}: starting from step 0 (preset cpu-tiny16)" in first.stdout.splitlines()
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    proc = run_cli("train_accelerate.py", args)
    assert "nothing to train: step 3 of --max_train_steps 3 reached" in proc.stdout
    assert "starting from step 0" not in proc.stdout
    assert "data: " not in proc.stdout  # decided from the checkpoint before any image was decoded
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == files
    proc = run_cli("train_accelerate.py", [*args, "--max_train_steps", "5"])
    assert "resumed from" in proc.stdout and json.loads((out / "export.json").read_text())["step"] == 5


def test_a_run_is_finished_only_once_its_last_step_is_exported(tmp_path):
    from types import SimpleNamespace

    from adaptive.checkpoint import Progress
    from adaptive.export import finished_run

    cfg = SimpleNamespace(output_dir=str(tmp_path), max_train_minutes=None)
    assert finished_run(cfg, Progress(step=10), 10) is None  # trained, never exported (killed during the export)
    (tmp_path / "export.json").write_text(json.dumps({"step": 8}))
    assert finished_run(cfg, Progress(step=10), 10) is None  # an older export (--save_model_steps)
    (tmp_path / "export.json").write_text(json.dumps({"step": 10}))
    assert "step 10 of --max_train_steps 10" in finished_run(cfg, Progress(step=10), 10)
    assert finished_run(cfg, Progress(step=10), 20) is None  # more steps asked for
    cfg.max_train_minutes = 1.0
    assert "budget of 1 min spent" in finished_run(cfg, Progress(step=10, train_seconds=61.0), 20)
    assert finished_run(cfg, Progress(step=10, train_seconds=59.0), 20) is None
    for cut_short in ('{"step": 10', '[10]', '{"metrics": {}}'):  # a record a crash or a hand cut short is no export
        (tmp_path / "export.json").write_text(cut_short)
        assert finished_run(cfg, Progress(step=10), 10) is None


def test_a_fresh_start_names_its_folder_and_preset_and_a_replacement_says_so(tmp_path):
    """Issue 29.4: every run that does not resume says where it starts from step 0 and with which preset."""
    from types import SimpleNamespace

    from adaptive.rundir import fresh_start_line

    cfg = SimpleNamespace(output_dir=str(tmp_path / "runs" / "ddpm"), overwrite_output_dir=False, preset="ddpm-cifar10")
    assert fresh_start_line(cfg) == \
        f"no checkpoint in {tmp_path / 'runs' / 'ddpm'}: starting from step 0 (preset ddpm-cifar10)"
    (tmp_path / "runs" / "ddpm" / "checkpoint-10").mkdir(parents=True)
    cfg.overwrite_output_dir = True
    assert fresh_start_line(cfg) == (f"--overwrite_output_dir: replacing the run in {tmp_path / 'runs' / 'ddpm'}, "
                                     "starting from step 0 (preset ddpm-cifar10)")
