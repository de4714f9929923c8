"""Post-hoc EMA (Karras et al. 2024): profile algebra, reconstruction accuracy, and the reconstruct_ema.py round
trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from adaptive.phema import PowerEMAs, power_ema_beta, profile_dot, sigma_rel_to_gamma, solve_coefficients

from conftest import run_cli, tiny_args


def test_sigma_rel_and_gamma_match_edm2():
    # EDM2's published pairs: sigma_rel 0.05 <-> gamma 16.97, 0.10 <-> gamma 6.94
    assert sigma_rel_to_gamma(0.05) == pytest.approx(16.97, abs=0.01)
    assert sigma_rel_to_gamma(0.10) == pytest.approx(6.94, abs=0.01)
    g = sigma_rel_to_gamma(0.08)
    assert ((g + 1) / ((g + 2) ** 2 * (g + 3))) ** 0.5 == pytest.approx(0.08)


def test_profile_inner_product_matches_numerical_integration():
    tau = np.linspace(0, 500, 2_000_001)
    for (ta, ga, tb, gb) in ((300, 6.94, 500, 16.97), (500, 3.0, 500, 3.0), (120, 16.97, 80, 6.94)):
        fa = np.where(tau <= ta, (ga + 1) * tau**ga / ta ** (ga + 1), 0)
        fb = np.where(tau <= tb, (gb + 1) * tau**gb / tb ** (gb + 1), 0)
        assert profile_dot(ta, ga, tb, gb) == pytest.approx(np.trapezoid(fa * fb, tau), rel=1e-3)


def test_reconstruction_recovers_a_power_ema_it_never_tracked():
    """Track sigma 0.05 and 0.10 on a drifting random walk, snapshot every 25 steps, rebuild sigma 0.075 at the end
    and compare with a power EMA of 0.075 computed directly."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    tracked, direct = PowerEMAs(model, [0.05, 0.10]), PowerEMAs(model, [0.075])
    snaps = []
    for step in range(1, 401):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 + 0.1 * torch.randn_like(p))  # drift + noise
        tracked.update(model)
        direct.update(model)
        if step % 25 == 0:
            for m, g in zip(tracked.models, tracked.gammas):
                snaps.append((step, g, torch.cat([p.detach().flatten().clone() for p in m.parameters()])))
    coef = solve_coefficients([s for s, _, _ in snaps], [g for _, g, _ in snaps], 400, sigma_rel_to_gamma(0.075))
    rebuilt = sum(float(c) * v for c, (_, _, v) in zip(coef, snaps))
    truth = torch.cat([p.detach().flatten() for p in direct.models[0].parameters()])
    current = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (rebuilt - truth).abs().max() < 0.02 * (current - truth).abs().max()
    assert sum(coef) == pytest.approx(1.0, abs=1e-3)


def test_power_ema_first_update_copies():
    assert power_ema_beta(6.94, 1) == 0.0 and 0 < power_ema_beta(6.94, 100) < 1


@pytest.mark.slow
def test_training_snapshots_and_reconstruct_ema_cli(tmp_path, image_folder, monkeypatch, capsys):
    from diffusers import DDPMPipeline

    run = tmp_path / "run"
    run_cli("train_accelerate.py", tiny_args(image_folder, run, "--max_train_steps", "6", "--save_images_steps", "none",
                                            "--ema_snapshots", "0.05", "0.10", "--ema_snapshot_steps", "2"))
    assert len(list((run / "ema_snapshots").glob("*.safetensors"))) == 6  # steps 2, 4, 6 x two profiles
    out = tmp_path / "phema"
    proc = run_cli("reconstruct_ema.py", ["--run_dir", str(run), "--sigma_rel", "0.08", "--output_dir", str(out)])
    assert "sigma_rel=0.08 at step 6 from 6 snapshots" in proc.stdout
    info = json.loads((out / "phema.json").read_text())
    assert sum(info["coefficients"]) == pytest.approx(1.0, abs=0.05)
    pipe = DDPMPipeline.from_pretrained(out)
    img = pipe(batch_size=1, num_inference_steps=2, output_type="np").images
    assert img.shape == (1, 16, 16, 3)
    from huggingface_hub import ModelCard

    card = ModelCard.load(out / "README.md")  # a model card of its own: what was reconstructed, from which snapshots
    assert card.data.library_name == "diffusers" and "post-hoc EMA sigma_rel 0.08" in card.text
    assert ("| EMA | post-hoc (Karras et al. 2024): sigma_rel 0.08 at step 6, from 6 snapshots (sigma_rel 0.05, 0.1 at "
            "steps 2, 4, 6) |") in card.text
    snippet = card.text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(snippet, scope)  # loads the reconstructed folder itself
    assert len(scope["images"]) == 16
    monkeypatch.setattr("adaptive.progress.DELAY_S", 0.0)  # issue 56: combining snapshots shows its progress
    import reconstruct_ema

    assert reconstruct_ema.main(["--run_dir", str(run), "--sigma_rel", "0.09", "--output_dir", str(tmp_path / "p9")]) == 0
    assert "reconstruct_ema.py: sigma_rel 0.09: snapshots: 6/6 snapshot (100%)" in capsys.readouterr().out
    bad = run_cli("reconstruct_ema.py", ["--run_dir", str(tmp_path), "--sigma_rel", "0.08"], check=False)
    assert bad.returncode == 2 and "has no config.json" in bad.stderr
