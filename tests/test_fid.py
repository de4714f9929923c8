"""Frechet distance, KID and precision/recall properties; evaluate_fid.py on generated images with a tiny TorchScript
feature network made here (no Inception weights, no clean-fid statistics, nothing from ../shared)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaptive.fid import feature_stats, frechet_distance, kernel_inception_distance, precision_recall, save_stats

from conftest import run_cli, tiny_args, write_images, write_pooled_features

METRIC_KEYS = {"proxy_fd", "kid", "precision", "recall", "num_images", "feature_extractor", "mode", "reference",
               "sampler", "num_inference_steps", "samples"}


# ----------------------------------------------------------------------------------------------------------------
# Pure metrics.


def test_fd_of_a_set_with_itself_is_zero_and_fd_is_symmetric():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 8)) @ rng.normal(size=(8, 8))
    b = rng.normal(1.0, 2.0, size=(400, 8))
    mu_a, s_a = feature_stats(a)
    mu_b, s_b = feature_stats(b)
    assert abs(frechet_distance(mu_a, s_a, mu_a, s_a)) < 1e-6
    ab, ba = frechet_distance(mu_a, s_a, mu_b, s_b), frechet_distance(mu_b, s_b, mu_a, s_a)
    assert ab > 1 and ab == pytest.approx(ba, rel=1e-6)


def _closed_form(mu1, s1, mu2, s2):
    """FD of N(mu1, diag s1) and N(mu2, diag s2): ||mu1 - mu2||^2 + sum_i (s1_i + s2_i - 2 sqrt(s1_i s2_i))."""
    return float(((mu1 - mu2) ** 2).sum() + (s1 + s2 - 2 * np.sqrt(s1 * s2)).sum())


def test_fd_of_diagonal_gaussians_has_the_closed_form_value():
    mu1, mu2 = np.array([0.0, 1.0, -2.0, 0.5]), np.array([1.0, 1.0, 0.0, -0.5])
    s1, s2 = np.array([1.0, 4.0, 0.25, 2.0]), np.array([2.0, 1.0, 0.25, 0.5])
    expected = _closed_form(mu1, s1, mu2, s2)  # 6 + (3 - 2 sqrt 2) + 1 + 0 + (2.5 - 2) = 7.6716
    assert frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2)) == pytest.approx(expected, rel=1e-9)
    # ... and, within sampling error, from features drawn from those Gaussians.
    rng = np.random.default_rng(1)
    f1 = mu1 + np.sqrt(s1) * rng.normal(size=(50_000, 4))
    f2 = mu2 + np.sqrt(s2) * rng.normal(size=(50_000, 4))
    assert frechet_distance(*feature_stats(f1), *feature_stats(f2)) == pytest.approx(expected, abs=0.08)


def test_kid_matches_clean_fid_and_is_about_zero_for_one_distribution():
    from cleanfid.fid import kernel_distance

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(300, 8)), rng.normal(size=(300, 8))

    def kid(a, b):
        return kernel_inception_distance(a, b, num_subsets=5)

    # With N <= max_subset_size every subset is the whole set (permuted), so clean-fid's random subsets do not matter.
    assert kid(x, y + 0.3) == pytest.approx(kernel_distance(x, y + 0.3, num_subsets=5), rel=1e-9)
    shifted = kid(x, y + 0.5)
    assert shifted > 0.5
    assert abs(kid(x, y)) < 0.05 * shifted
    assert abs(kid(x, x)) < 0.1 * shifted  # the unbiased estimator on one set: ~ -O(1/N)


def test_two_writers_of_one_reference_file_both_succeed_and_leave_a_complete_file(tmp_path, monkeypatch):
    """Runs sharing the cache may save the same reference at once: writer B finishing between A's write and A's rename
    must fail neither, leave a whole file (the last one renamed) and no temporary files."""
    import adaptive.fid as fid

    path, real_savez, calls = tmp_path / "ref.npz", np.savez, []

    def savez_then_another_writer(file, **arrays):
        real_savez(file, **arrays)
        if not calls:
            calls.append(file)
            save_stats(path, np.full(3, 2.0), np.eye(3), writer="B")  # B writes and renames while A is mid-way

    monkeypatch.setattr(fid.np, "savez", savez_then_another_writer)
    save_stats(path, np.full(3, 1.0), np.eye(3), writer="A")
    with np.load(path) as z:
        assert z["mu"].tolist() == [1.0, 1.0, 1.0] and "'A'" in str(z["meta"])
    assert [p.name for p in tmp_path.iterdir()] == ["ref.npz"]
    umask = os.umask(0)
    os.umask(umask)
    # as a plain open() creates it: a shared --cache_dir stays readable
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_precision_recall_of_identical_and_of_far_apart_sets():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 16))
    assert precision_recall(x, x, k=3) == (1.0, 1.0)
    assert precision_recall(x, x + 100.0, k=3) == (0.0, 0.0)
    p, r = precision_recall(x, 0.5 * rng.normal(size=(200, 16)), k=3)  # a narrower fake set: precise, low recall
    assert p > 0.9 and r < 0.6


# ----------------------------------------------------------------------------------------------------------------
# A tiny TorchScript feature network and image sets.


class TinyFeatures(torch.nn.Module):
    """[N, 3, H, W] in [0, 255] -> [N, 16]: the proxy-network contract (shared/eval/README.md), at toy size."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x / 127.5 - 1.0, size=(8, 8), mode="bilinear", antialias=True, align_corners=False)
        return torch.tanh(self.conv(x)).mean(dim=(2, 3))


@pytest.fixture(scope="module")
def extractor(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("net") / "tiny-features.pt"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
        torch.jit.script(TinyFeatures().eval()).save(str(path))
    return path


def write_noise(folder: Path, n: int, size: int = 32, high: int = 60, seed: int = 5) -> Path:
    """Dark uniform-noise images: a distribution far from write_images' smooth colour fields."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, high, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:04d}.png")
    return folder


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    return {"a": write_images(root / "a", n_per_class=20), "b": write_images(root / "b", n_per_class=20, seed=1),
            "noise": write_noise(root / "noise", 40)}


def _evaluate(*args: str) -> int:
    from evaluate_fid import main

    return main([*map(str, args), "--device", "cpu"])


def test_in_training_evaluation_and_evaluate_fid_give_the_same_fd_for_the_same_images(tmp_path, sets, extractor,
                                                                                       monkeypatch, capsys):
    """The same generated images, network and reference (the training data at 16 px, a 24-image subset): the in-training
    evaluator and evaluate_fid.py on the images it would save agree to 1e-6 (one pipeline, adaptive/fid.py). Both
    show their progress (issue 56; here without a terminal: lines on stdout, shown at once with DELAY_S 0)."""
    monkeypatch.setattr("adaptive.progress.DELAY_S", 0.0)
    from contextlib import nullcontext
    from types import SimpleNamespace

    from PIL import Image

    from adaptive.config import PRESETS, TrainConfig
    from adaptive.data import decode_all, open_entries
    from adaptive.evaluation import InTrainingEvaluator
    from adaptive.image_sampler import ddpm_sample
    from adaptive.model import build_noise_scheduler, build_unet

    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "train_data_dir": str(sets["a"]),
                         "eval_feature_extractor": str(extractor), "eval_num_images": 20, "eval_inference_steps": 3,
                         "eval_ref_num_images": 24, "cache_dir": str(tmp_path / "cache"), "eval_at_steps": (1,)})
    acc = SimpleNamespace(device=torch.device("cpu"), process_index=0, num_processes=1, is_main_process=True,
                          autocast=nullcontext, main_process_first=nullcontext)
    torch.manual_seed(0)
    unet, sched = build_unet(cfg).eval(), build_noise_scheduler(cfg)
    evaluator = InTrainingEvaluator(cfg, acc, decode_all(open_entries(cfg), 16), log=lambda m: None)
    in_training = evaluator(unet, sched.config)["proxy_fd"]
    shown = capsys.readouterr().out
    for line in ("reference statistics: features: 24/24 img (100%)", "evaluation: sampling: 20/20 img (100%)",
                 "evaluation: features: 20/20 img (100%)"):
        assert line in shown, shown
    samples = tmp_path / "samples"
    samples.mkdir()
    images = ddpm_sample(unet, sched.config, [cfg.eval_seed_offset + i for i in range(20)], 3)
    for i, img in enumerate(images.numpy()):
        Image.fromarray(img).save(samples / f"{i:06d}.png")
    out = tmp_path / "m.json"
    assert _evaluate("--samples", samples, "--num_images", "20", "--feature_extractor", extractor, "--ref_dir",
                     sets["a"], "--ref_num_images", "24", "--cache_dir", tmp_path / "cache2", "--output", out) == 0
    m = json.loads(out.read_text())
    assert m["proxy_fd"] == pytest.approx(in_training, rel=1e-6) and in_training > 0
    shown = capsys.readouterr().out
    assert "evaluate_fid.py: features of the samples: 20/20 img (100%)" in shown, shown
    assert "evaluate_fid.py: decoding the reference" in shown and "reference statistics: features: 24/24" in shown
    assert m["reference_resized_from"] == [32, 32]  # the 32 px training images, resized to the samples' 16 px
    import inspect

    from evaluate_fid import FEATURE_BATCH
    from adaptive.fid import FeatureNet

    assert FEATURE_BATCH == inspect.signature(FeatureNet).parameters["batch_size"].default  # the evaluator's batches


@pytest.mark.slow
def test_like_run_reproduces_the_logged_score_bit_for_bit(tmp_path, image_folder, capsys):
    """A tiny run evaluated at step 2: sample.py --like_run RUN from its checkpoint-2, then evaluate_fid.py --like_run
    RUN gives the logged proxy FD exactly (seeds 1000000 + i, its steps, precision, image count, network, reference).
    Samples made otherwise are scored with a warning (and another number)."""
    feat = write_pooled_features(tmp_path / "feat.pt")  # 48 features
    run = tmp_path / "run"
    proc = run_cli("train_accelerate.py", tiny_args(
        image_folder, run, "--max_train_steps", "2", "--checkpointing_steps", "2", "--save_images_steps", "none",
        "--eval_at_steps", "2", "--eval_num_images", "6", "--eval_inference_steps", "3", "--eval_feature_extractor",
        str(feat), "--eval_ref_num_images", "16"))
    assert ("warning: the evaluation (--eval_num_images) has 6 images, fewer than the 48 feature dimensions: its "
            "covariance is singular and the Frechet distance unreliable") in proc.stdout  # as evaluate_fid.py says it
    logged = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines() if "proxy_fd" in line]
    assert [r["step"] for r in logged] == [2]
    samples = tmp_path / "samples"
    run_cli("sample.py", ["--model_path", str(run / "checkpoint-2"), "--like_run", str(run),
                          "--output_dir", str(samples)])
    made = json.loads((samples / "sampling.json").read_text())
    assert (made["num_images"], made["seed_offset"], made["num_inference_steps"], made["scheduler"]) == \
        (6, 1_000_000, 3, "ddpm")
    assert made["mixed_precision"] == json.loads((run / "config.json").read_text())["mixed_precision"]
    assert _evaluate("--samples", samples, "--like_run", run, "--output", tmp_path / "m.json") == 0
    scored = json.loads((tmp_path / "m.json").read_text())
    assert scored["proxy_fd"] == logged[0]["proxy_fd"]  # bit for bit
    assert (scored["num_images"], scored["reference_num_images"], scored["like_run"]) == (6, 16, str(run))

    other = tmp_path / "other"
    run_cli("sample.py", ["--model_path", str(run / "checkpoint-2"), "--output_dir", str(other), "--num_images", "6",
                          "--num_inference_steps", "3", "--mixed_precision", made["mixed_precision"]])
    capsys.readouterr()
    assert _evaluate("--samples", other, "--like_run", run, "--output", tmp_path / "o.json") == 0
    err = capsys.readouterr().err
    assert ("warning: --samples were not made as --like_run's evaluation sampled (seed_offset 0 (the run's: "
            "1000000)), so the score is not comparable with the logged one; make them with sample.py --like_run") in err
    assert ("warning: --samples has 6 images, fewer than the 48 feature dimensions: its covariance is singular and the "
            "Frechet distance unreliable") in err  # the in-training evaluation's warning above, word for word
    assert json.loads((tmp_path / "o.json").read_text())["proxy_fd"] != logged[0]["proxy_fd"]


# ----------------------------------------------------------------------------------------------------------------
# evaluate_fid.py.


@pytest.mark.slow
def test_evaluate_fid_end_to_end_writes_complete_metrics(tmp_path, sets, extractor):
    """A folder scored against itself as the reference: proxy FD ~ 0, P = R = 1; every metrics.json key present."""
    out = tmp_path / "metrics.json"
    proc = run_cli("evaluate_fid.py", ["--samples", str(sets["a"]), "--num_images", "40", "--feature_extractor",
                                       str(extractor), "--ref_dir", str(sets["a"]), "--output", str(out),
                                       "--cache_dir", str(tmp_path / "cache"), "--device", "cpu"])
    m = json.loads(out.read_text())
    assert METRIC_KEYS <= set(m) and "fid" not in m
    assert abs(m["proxy_fd"]) < 1e-6 and m["precision"] == m["recall"] == 1.0 and abs(m["kid"]) < 0.05
    assert m["num_images"] == 40 and m["feature_extractor"] == "tiny-features.pt" and m["mode"] == "clean"
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("proxy_fd=") and "(40 images, tiny-features.pt, clean, ref=" in line


def test_fd_grows_with_distribution_shift_and_make_ref_is_reused(tmp_path, sets, extractor, capsys):
    common = ["--num_images", "40", "--feature_extractor", extractor, "--cache_dir", tmp_path / "cache"]
    fd = {}
    for name in ("b", "noise"):
        out = tmp_path / f"{name}.json"
        assert _evaluate("--samples", sets["a"], "--ref_dir", sets[name], "--output", out, *common) == 0
        fd[name] = json.loads(out.read_text())["proxy_fd"]
    assert 0 < fd["b"] < fd["noise"] / 10

    # --make_ref writes statistics with features; --ref_stats then gives the same numbers as --ref_dir.
    stats = tmp_path / "ref.npz"
    assert _evaluate("--make_ref", "--ref_dir", sets["noise"], "--ref_stats", stats, *common) == 0
    assert str(stats) in capsys.readouterr().out
    assert _evaluate("--samples", sets["a"], "--ref_stats", stats, "--output", tmp_path / "s.json", *common) == 0
    by_stats, by_dir = json.loads((tmp_path / "s.json").read_text()), json.loads((tmp_path / "noise.json").read_text())
    for key in ("proxy_fd", "kid", "precision", "recall"):
        assert by_stats[key] == pytest.approx(by_dir[key], rel=1e-6, abs=1e-9)

    # Statistics without features: FD only; KID and P/R are null with a reason.
    feats = np.random.default_rng(0).normal(size=(50, 16))
    save_stats(tmp_path / "mu_sigma.npz", *feature_stats(feats))
    assert _evaluate("--samples", sets["a"], "--ref_stats", tmp_path / "mu_sigma.npz", "--output", tmp_path / "n.json",
                     *common) == 0
    m = json.loads((tmp_path / "n.json").read_text())
    assert m["proxy_fd"] > 0 and m["kid"] is None and m["precision"] is None and "features" in m["null_reasons"]["kid"]


def test_reference_from_a_dataset_equals_the_same_images_as_files(tmp_path, sets, extractor, monkeypatch):
    from PIL import Image

    import adaptive.data
    import adaptive.sources

    arr = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(sets["a"].rglob("*.png"))])
    monkeypatch.setattr(adaptive.data, "open_entries",
                        lambda cfg, **kw: adaptive.sources.ArrayEntries(arr, "fake dataset"))
    out = tmp_path / "m.json"
    assert _evaluate("--samples", sets["a"], "--num_images", "40", "--feature_extractor", extractor, "--ref_dataset",
                     "fake", "--cache_dir", tmp_path / "cache", "--output", out) == 0
    m = json.loads(out.read_text())
    assert abs(m["proxy_fd"]) < 1e-6 and m["reference"] == "fake dataset" and m["reference_num_images"] == 40


def test_evaluate_fid_scores_sample_npz_with_its_sampling_record(tmp_path, sets, extractor):
    from PIL import Image

    run = tmp_path / "samples"
    run.mkdir()
    arr = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(sets["a"].rglob("*.png"))])
    np.savez(run / "samples.npz", arr_0=arr)
    (run / "sampling.json").write_text(json.dumps({"sampler": "ddpm (ancestral)", "num_inference_steps": 100}))
    assert _evaluate("--samples", run / "samples.npz", "--num_images", "40", "--feature_extractor", extractor,
                     "--ref_dir", sets["a"], "--cache_dir", tmp_path / "cache") == 0
    m = json.loads((run / "metrics.json").read_text())
    assert abs(m["proxy_fd"]) < 1e-6  # the npz holds the reference's pixels: same pipeline, same features
    assert m["sampler"] == "ddpm (ancestral)" and m["num_inference_steps"] == 100


def _one_line_error(capsys, *args) -> str:
    assert _evaluate(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evaluate_fid.py: error: ") and "\n" not in err
    return err


def test_evaluate_fid_bad_input_gives_one_line_errors(tmp_path, sets, extractor, capsys):
    ext = ["--feature_extractor", extractor, "--cache_dir", tmp_path / "cache"]
    assert "does not exist" in _one_line_error(capsys, "--samples", tmp_path / "nope", "--ref_dir", sets["a"], *ext)
    (tmp_path / "empty").mkdir()
    assert "no images" in _one_line_error(capsys, "--samples", tmp_path / "empty", "--ref_dir", sets["a"], *ext)
    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "50", "--ref_dir", sets["a"], *ext)
    assert "holds 40 images" in err and "50" in err

    broken = write_noise(tmp_path / "broken", 3)
    (broken / "0001.png").write_bytes(b"not a png")
    err = _one_line_error(capsys, "--samples", broken, "--num_images", "3", "--ref_dir", sets["a"], *ext)
    assert "0001.png" in err

    mixed = write_noise(tmp_path / "mixed", 3)
    write_noise(mixed / "small", 1, size=16)
    err = _one_line_error(capsys, "--samples", mixed, "--num_images", "4", "--ref_dir", sets["a"], *ext)
    assert "32x32" in err and "16x16" in err

    small = write_noise(tmp_path / "small", 40, size=16)
    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "40", "--ref_dir", small, *ext)
    assert "16x16" in err and "32x32" in err and "only resized down" in err

    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "40", *ext)
    assert "--ref_dir" in err and "Inception" in err


def test_missing_inception_weights_say_where_to_put_them(tmp_path, sets, capsys, monkeypatch):
    import socket

    import adaptive.fid

    def offline(*args, **kwargs):
        raise OSError("offline")

    where = str(tmp_path / "inception-2015-12-05.pt")
    monkeypatch.setattr(adaptive.fid, "INCEPTION_FILE", where)
    monkeypatch.setattr(socket, "create_connection", offline)
    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "40")
    assert where in err and "--feature_extractor" in err


def test_saved_reference_statistics_carry_their_metadata_and_a_mismatch_is_refused(tmp_path, sets, extractor, capsys):
    """--make_ref records resolution, network and content; scoring 32 px samples against 16 px statistics, or with
    another network, is refused in one line - in evaluate_fid.py and in training (--eval_ref_stats) alike."""
    from adaptive.config import PRESETS, TrainConfig
    from adaptive.evaluation import training_reference
    from adaptive.fid import FeatureNet, stats_meta

    stats = tmp_path / "ref16.npz"
    common = ["--feature_extractor", extractor, "--cache_dir", tmp_path / "cache"]
    assert _evaluate("--make_ref", "--ref_dir", sets["a"], "--resolution", "16", "--ref_stats", stats, *common) == 0
    meta = stats_meta(stats)
    assert meta["resolution"] == [16, 16] and meta["feature_extractor"].startswith("torchscript:") and meta["content"]
    capsys.readouterr()
    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "40", "--ref_stats", stats, *common)
    assert "16x16" in err and "32x32" in err
    other = tmp_path / "other.pt"
    torch.manual_seed(1)
    torch.jit.script(TinyFeatures().eval()).save(str(other))
    err = _one_line_error(capsys, "--samples", sets["a"], "--num_images", "40", "--ref_stats", stats,
                          "--feature_extractor", other, "--cache_dir", tmp_path / "cache")
    assert "were built with tiny-features.pt" in err
    cfg = TrainConfig(**{**PRESETS["cpu-tiny16"], "eval_feature_extractor": str(other), "eval_ref_stats": str(stats)})
    from adaptive.config import ConfigError

    with pytest.raises(ConfigError, match="were built with"):
        training_reference(cfg, FeatureNet(str(other)), None)
    # 40 images < nothing to warn about for 16 features; 8 images < 16 dimensions: warned
    warned = []
    from adaptive.fid import warn_if_few

    warn_if_few(8, 16, "--samples", warned.append)
    warn_if_few(40, 16, "--samples", warned.append)
    assert len(warned) == 1 and "fewer than the 16 feature dimensions" in warned[0]
