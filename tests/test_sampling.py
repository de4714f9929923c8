"""sample.py: one seed per image, so the images equal Diffusers' DDPMPipeline with per-image generators and do not
depend on the batch size, the number of processes or on resuming."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptive.image_sampler import shard

from conftest import run_cli

STEPS = 4  # respaced DDPM ancestral sampling: 4 of the scheduler's 1000 steps
SEED_OFFSET = 100


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    """A tiny DDPMPipeline (8 px UNet2DModel, default 1000-step DDPMScheduler) saved as a training run would be."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, block_out_channels=(32, 32), layers_per_block=1, norm_num_groups=8,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    path = tmp_path_factory.mktemp("model") / "pipeline"
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler()).save_pretrained(str(path))
    return path


def _sample(model_path: Path, out: Path, *extra: str) -> int:
    from sample import main

    return main(["--model_path", str(model_path), "--output_dir", str(out), "--num_inference_steps", str(STEPS),
                 "--seed_offset", str(SEED_OFFSET), "--mixed_precision", "no", *map(str, extra)])


def _pngs(out: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    return {p.name: np.asarray(Image.open(p)) for p in sorted((out / "images").glob("*.png"))}


@pytest.fixture(scope="module")
def batch4(model_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("samples") / "b4"
    assert _sample(model_path, out, "--num_images", 9, "--batch_size", 4, "--npz") == 0
    return out


def test_images_equal_diffusers_pipeline_with_per_image_generators(model_path, batch4):
    from diffusers import DDPMPipeline

    pipe = DDPMPipeline.from_pretrained(str(model_path))
    pipe.set_progress_bar_config(disable=True)
    seeds = [SEED_OFFSET + i for i in range(9)]
    ref = pipe(batch_size=9, generator=[torch.Generator().manual_seed(s) for s in seeds], num_inference_steps=STEPS,
               output_type="np").images
    ref = (ref * 255).round().astype(np.uint8)  # DDPMPipeline.numpy_to_pil's rounding
    imgs = _pngs(batch4)
    assert list(imgs) == [f"{i:06d}.png" for i in range(9)]
    assert np.array_equal(np.stack(list(imgs.values())), ref)
    assert ref.std() > 10  # not a degenerate (constant) image set
    with np.load(batch4 / "samples.npz") as z:
        assert z["arr_0"].dtype == np.uint8 and np.array_equal(z["arr_0"], ref)
    info = json.loads((batch4 / "sampling.json").read_text())
    assert info["complete"] and info["sampler"] == "ddpm (ancestral)" and info["num_inference_steps"] == STEPS
    assert info["num_images"] == 9 and info["seed_offset"] == SEED_OFFSET and info["world_size"] == 1
    assert (batch4 / "grid.png").is_file()


def test_batch_size_does_not_change_the_images(model_path, batch4, tmp_path):
    assert _sample(model_path, tmp_path / "b7", "--num_images", 9, "--batch_size", 7) == 0
    a, b = _pngs(batch4), _pngs(tmp_path / "b7")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("n,world", [(0, 2), (1, 2), (7, 2), (9, 4), (10, 3), (64, 8)])
def test_shards_cover_every_index_once(n, world):
    parts = []
    for rank in range(world):
        mine, real = shard(list(range(n)), rank, world)
        parts.append(mine[:real])
    assert sum(parts, []) == list(range(n))
    assert all(p == list(range(p[0], p[0] + len(p))) for p in parts if p)  # contiguous chunks


def test_resume_generates_only_missing_images_and_refuses_other_settings(model_path, batch4, tmp_path, capsys):
    import shutil

    out = tmp_path / "resume"
    shutil.copytree(batch4, out)
    for i in (2, 5):
        (out / "images" / f"{i:06d}.png").unlink()
    assert _sample(model_path, out, "--num_images", 11, "--batch_size", 4) == 0
    info = json.loads((out / "sampling.json").read_text())
    assert info["generated"] == 4 and info["num_images"] == 11  # 2 deleted + 2 new
    assert _pngs(out).keys() == {f"{i:06d}.png" for i in range(11)}
    assert all(np.array_equal(v, _pngs(batch4)[k]) for k, v in _pngs(batch4).items())

    capsys.readouterr()
    assert _sample(model_path, out, "--num_images", 11, "--scheduler", "ddim") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sample.py: error: ") and "scheduler" in err and "--overwrite" in err and "\n" not in err

    assert _sample(model_path, out, "--num_images", 3, "--scheduler", "ddim", "--overwrite") == 0
    info = json.loads((out / "sampling.json").read_text())
    assert info["sampler"] == "ddim (deterministic, NOT the DDPM protocol)" and info["generated"] == 3
    assert len(_pngs(out)) == 3


def test_bad_arguments_are_one_line_errors(model_path, tmp_path, capsys):
    assert _sample(tmp_path / "no-model", tmp_path / "o", "--num_images", 1) == 2
    assert f"--model_path {tmp_path / 'no-model'}: not found (no such folder" in capsys.readouterr().err
    from sample import main

    assert main(["--model_path", str(model_path), "--output_dir", str(tmp_path / "o"), "--num_inference_steps",
                 "1001"]) == 2
    assert "between 1 and the model's 1000" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_write_the_same_images_as_one(model_path, batch4, tmp_path):
    out = tmp_path / "two"
    args = ["--model_path", str(model_path), "--output_dir", str(out), "--num_inference_steps", str(STEPS),
            "--seed_offset", str(SEED_OFFSET), "--num_images", "9", "--batch_size", "3", "--npz"]
    run_cli("sample.py", args, nproc=2)
    assert json.loads((out / "sampling.json").read_text())["world_size"] == 2
    a, b = _pngs(batch4), _pngs(out)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    with np.load(out / "samples.npz") as z, np.load(batch4 / "samples.npz") as y:
        assert np.array_equal(z["arr_0"], y["arr_0"])


@pytest.mark.slow
def test_compiled_sampling_gives_the_eager_images(model_path, batch4, tmp_path):
    # sample.py --compile: inductor with frozen weights; same images up to float rounding of fused kernels
    import torch._inductor.config as inductor_config

    out = tmp_path / "compiled"
    # restored after the test by torch's own config patch: monkeypatch's undo would delete the key from inductor's
    # config module, and every later torch.compile in this process would fail on it
    with inductor_config.patch(freezing=False):
        assert _sample(model_path, out, "--num_images", 8, "--batch_size", 4, "--compile") == 0  # one batch shape
        assert inductor_config.freezing
    assert not inductor_config.freezing
    eager, compiled = np.stack(list(_pngs(batch4).values())[:8]), np.stack(list(_pngs(out).values()))
    diff = np.abs(eager.astype(int) - compiled.astype(int))
    assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert json.loads((out / "sampling.json").read_text())["compile"] is True


@pytest.mark.slow
def test_sample_from_a_checkpoint_or_a_run_left_before_its_export(tmp_path, image_folder):
    """A checkpoint holds the EMA U-Net in save_pretrained layout; sample.py takes a checkpoint folder (EMA or raw
    weights) or a run folder without an export (its newest valid checkpoint, said on stderr), with the images of the
    equivalent DDPMPipeline."""
    from diffusers import DDPMPipeline, UNet2DModel
    from safetensors.torch import load_file

    from conftest import tiny_args

    run = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, run, "--max_train_steps", "4", "--checkpointing_steps", "2",
                                             "--save_images_steps", "none"))
    exported = DDPMPipeline.from_pretrained(run)
    ema = UNet2DModel.from_pretrained(run / "checkpoint-4" / "unet_ema")  # any Diffusers tool loads it
    for k, v in exported.unet.state_dict().items():
        assert torch.equal(v, ema.state_dict()[k]), k
    ref = run_cli("sample.py", ["--model_path", str(run), "--output_dir", str(tmp_path / "export"), "--num_images", "2",
                                "--num_inference_steps", "3", "--mixed_precision", "no"])
    for name in ("model_index.json", "unet", "scheduler", "export.json"):  # as if preempted before the export
        target = run / name
        target.unlink() if target.is_file() else __import__("shutil").rmtree(target)
    proc = run_cli("sample.py", ["--model_path", str(run), "--output_dir", str(tmp_path / "ckpt"), "--num_images", "2",
                                 "--num_inference_steps", "3", "--mixed_precision", "no"])
    assert "checkpoint-4, its newest valid checkpoint" in proc.stderr and ref.returncode == 0
    assert all(np.array_equal(a, b)
               for a, b in zip(_pngs(tmp_path / "export").values(), _pngs(tmp_path / "ckpt").values()))
    raw = tmp_path / "raw"
    run_cli("sample.py", ["--model_path", str(run / "checkpoint-2"), "--weights", "raw", "--output_dir", str(raw),
                          "--num_images", "2", "--num_inference_steps", "3", "--mixed_precision", "no"])
    assert json.loads((raw / "sampling.json").read_text())["weights"] == "raw"
    from adaptive.pipelines import load_pipeline

    pipe = load_pipeline(str(run / "checkpoint-2"), "raw")
    weights = load_file(str(run / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(v, weights[k]) for k, v in pipe.unet.state_dict().items())
    proc = run_cli("sample.py", ["--model_path", str(tmp_path), "--output_dir", str(tmp_path / "x")], check=False)
    assert proc.returncode == 2 and "no exported pipeline and no valid checkpoint" in proc.stderr


def test_sample_grids_are_enlarged_by_whole_pixels_to_at_least_256_px(tmp_path):
    """A 16 px grid of 64 images (146 px) is doubled to 292 px, each pixel a 2 x 2 block (nearest neighbour); a grid
    that is large enough keeps its size."""
    from PIL import Image

    from adaptive.image_sampler import save_grid

    imgs = np.random.default_rng(0).integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)
    grid = np.asarray(Image.open(save_grid(imgs, tmp_path / "small.png")))
    assert grid.shape == (292, 292, 3)  # (8 x (16 + 2) + 2) x 2
    assert np.array_equal(grid[4:36, 4:36], imgs[0].repeat(2, axis=0).repeat(2, axis=1))
    big = np.zeros((4, 160, 160, 3), dtype=np.uint8)
    assert np.asarray(Image.open(save_grid(big, tmp_path / "big.png"))).shape == (326, 326, 3)  # 2 x 162 + 2


def test_a_local_looking_model_path_that_does_not_exist_is_not_found_without_asking_the_hub(tmp_path, monkeypatch):
    """Issue 29.4: runs/nonexistent, ./x, /abs, a/b/c are "not found" at once; owner/name goes to the Hub."""
    from adaptive.config import ConfigError
    from adaptive.pipelines import load_pipeline, looks_local

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for path in ("runs/nonexistent", "./x", str(tmp_path / "x"), "a/b/c", "~/nope"):
        assert looks_local(path), path
        with pytest.raises(ConfigError, match=r"not found \(no such folder"):
            load_pipeline(path)
    assert not looks_local("google/ddpm-cifar10-32") and not looks_local("someone/tiny-ddpm")


def _diffusers_failure(cause: Exception):
    """DDPMPipeline.from_pretrained failing as diffusers' DiffusionPipeline.download does when the Hub lookup failed
    and nothing is cached: an OSError that points at a stacktrace the user never sees, raised from the real cause."""
    def from_pretrained(*args, **kwargs):
        try:
            raise cause
        except Exception as e:
            raise OSError("Cannot load model someone/ddpm: the model is not fully cached locally (...) and an error "
                          "occurred while trying to fetch metadata from the Hub. Please check out the root cause in "
                          "the stacktrace above.") from e

    return from_pretrained


def test_a_hub_id_that_fails_names_the_real_cause(monkeypatch):
    """Issue 29.4: the one line names the innermost error (offline mode, a refused connection), not diffusers'
    'check out the root cause in the stacktrace above'."""
    from diffusers import DDPMPipeline
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.utils import httpx  # the HTTP client huggingface_hub and diffusers use

    from adaptive.config import ConfigError
    from adaptive.pipelines import load_pipeline

    offline = "Cannot reach https://huggingface.co/api/models/someone/ddpm: offline mode is enabled."
    for cause, said in ((OfflineModeIsEnabled(offline), f"OfflineModeIsEnabled: {offline}"),
                        (httpx.ConnectError("[Errno 111] Connection refused"),
                         "ConnectError: [Errno 111] Connection refused")):
        monkeypatch.setattr(DDPMPipeline, "from_pretrained", _diffusers_failure(cause))
        with pytest.raises(ConfigError) as e:
            load_pipeline("someone/ddpm")
        assert str(e.value) == ("--model_path someone/ddpm: cannot load a DDPMPipeline from the Hub at "
                                f"{constants.ENDPOINT}: {said}")


@pytest.fixture
def hub_without_repos():
    """A Hub endpoint that answers every request as huggingface.co answers for a repo that does not exist."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"error": "Repository not found"}'
            self.send_response(404)
            for name, value in (("Content-Type", "application/json"), ("X-Error-Code", "RepoNotFound"),
                                ("Content-Length", str(len(body)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_a_hub_id_that_does_not_exist_is_one_line_naming_the_404(hub_without_repos, tmp_path):
    """Issue 29.4, end to end through diffusers and huggingface_hub: exit 2 and exactly one stderr line."""
    url = hub_without_repos
    proc = run_cli("sample.py", ["--model_path", "someone/missing", "--output_dir", str(tmp_path / "s")], check=False,
                   env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf"),
                        "NO_PROXY": "127.0.0.1,localhost"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"sample.py: error: --model_path someone/missing: cannot load a DDPMPipeline from the Hub at {url}: 404 Client "
        f"Error. Repository Not Found for url: {url}/api/models/someone/missing. (a private or gated repo needs a "
        "login or HF_TOKEN)"]
    assert not (tmp_path / "s").exists()
