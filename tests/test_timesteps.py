"""Timestep samplers: exact unbiasedness, valid probabilities, rank consistency, state round trip, paper values."""

from __future__ import annotations

import math

import pytest
import torch

from adaptive.config import PRESETS, TrainConfig
from adaptive.losses import DiffusionTables, min_snr_eps_weight, objective_weights, p2_eps_weight, snr
from adaptive.model import build_noise_scheduler
from adaptive.timesteps import METHODS, build_sampler
from adaptive.timesteps.base import DrawRequest, asked
from adaptive.timesteps.iddpm import IDDPMSampler

T = 1000


def make(name: str, **cfg_kw):
    cfg = TrainConfig.from_dict({**PRESETS["cpu-tiny16"], "timestep_sampler": name, **cfg_kw})
    tables = DiffusionTables.build(build_noise_scheduler(cfg).alphas_cumprod, cfg, "cpu")
    return build_sampler(cfg, "cpu", tables), tables


def synthetic_loss(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Per-sample losses shaped like epsilon-MSE: large at small t, ~0 near T, noisy."""
    base = 0.02 + 0.5 * torch.exp(-t.float() / 80)
    return base * torch.empty(t.shape).exponential_(1.0, generator=g)


def draw(sampler, n: int, generator: torch.Generator, step: int = 0, fraction: float = 0.0):
    """(t [n], m [n]) as the loop draws them (one rank, one micro-batch); a method that draws from x0 (kim2025) gets
    blank 16 px images."""
    request = DrawRequest(n, (slice(0, n),), generator, lambda micro: generator,
                          **asked(sampler.needs, step=step, fraction=fraction, batch=[torch.zeros(n, 3, 16, 16)]))
    d = sampler.draw(request)
    return d.t, d.m


def train_sampler(sampler, steps: int = 40, batch: int = 512, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        t, _ = draw(sampler, batch, torch.Generator().manual_seed(1000 + step))
        sampler.observe(t, synthetic_loss(t, g))
    return sampler


IMPORTANCE = ["adaptive", "iddpm", "uniform"]  # m = lambda(t) / (T p_t): unbiased for their declared objective


@pytest.mark.parametrize("name, cfg_kw", [(n, {}) for n in IMPORTANCE] + [("adaptive", {"adaptive_balance": 0.5}),
                                                                          ("adaptive", {"adaptive_stratified": False}),
                                                                          ("adaptive", {"adaptive_loss_scale": 0.1}),
                                                                          ("adaptive",
                                                                           {"adaptive_proposal_power": 0.5})])
def test_importance_samplers_are_exactly_unbiased(name, cfg_kw):
    """sum_t p(t) w(t) f(t) = mean_t lambda(t) f(t) for arbitrary f (lambda = 1 unless the method declares its own
    objective), computed from the returned probabilities and weights; plus a seeded Monte-Carlo check via sample()."""
    sampler = train_sampler(make(name, **cfg_kw)[0], steps=200)
    p = sampler.probabilities().double()
    w = sampler.weight_of(torch.arange(T)).double()
    lam = sampler.objective_weights().double()
    assert w.max() / w.min() > 1.5 or name == "uniform"  # proposal or objective really is non-uniform after training
    if not sampler.changes_objective:  # at most a global (step-dependent) rescaling of the configured objective
        assert torch.allclose(lam / lam[0], torch.ones(T, dtype=torch.float64))
    for seed in range(3):
        f = torch.randn(T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).exp()
        assert (p * w * f).sum().item() == pytest.approx((lam * f).mean().item(), rel=1e-5)
    t, wt = draw(sampler, 400_000, torch.Generator().manual_seed(7))
    f = torch.linspace(0.1, 3.0, T, dtype=torch.float64) ** 2
    mc = (wt.double() * f[t]).mean().item()
    assert mc == pytest.approx((lam * f).mean().item(), rel=0.01)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_probabilities_are_valid_and_weights_bounded_under_extreme_losses(name):
    sampler, _ = make(name)
    for fill in (0.0, 1e-30, 1e30, float("nan")):
        if fill != fill and not getattr(sampler, "tolerates_nan", True):
            continue
        for step in range(30):
            t, w = draw(sampler, 256, torch.Generator().manual_seed(step))
            assert t.dtype == torch.long and t.min() >= 0 and t.max() < T
            assert torch.isfinite(w).all() and (w > 0).all()
            loss = torch.full(t.shape, fill)
            loss[::3] = 1.0
            sampler.observe(t, loss)
        p = sampler.probabilities()
        assert torch.isfinite(p).all() and (p > 0).all()
        assert p.sum().item() == pytest.approx(1.0, abs=1e-5)
        w_all = sampler.weight_of(torch.arange(T))
        assert torch.isfinite(w_all).all() and w_all.max() < 1e4


@pytest.mark.parametrize("name", sorted(METHODS))
def test_state_round_trip_continues_identically(name, tmp_path):
    from adaptive.checkpoint import load_object_state, save_object_state

    a = train_sampler(make(name)[0], steps=25)
    save_object_state(tmp_path / "s.pt", a.state_dict())
    b, _ = make(name)
    b.load_state_dict(load_object_state(tmp_path / "s.pt"))  # weights_only=True: no pickled code
    for step in range(10):
        ta, wa = draw(a, 64, torch.Generator().manual_seed(step))
        tb, wb = draw(b, 64, torch.Generator().manual_seed(step))
        assert torch.equal(ta, tb) and torch.equal(wa, wb)
        loss = synthetic_loss(ta, torch.Generator().manual_seed(step))
        a.observe(ta, loss)
        b.observe(tb, loss)
    assert torch.equal(a.probabilities(), b.probabilities())


# -- paper values ----------------------------------------------------------------------------------------------------

def test_schedule_facts_from_the_research_notes():
    cfg = TrainConfig(**PRESETS["cpu-tiny16"])
    s = snr(build_noise_scheduler(cfg).alphas_cumprod.double())
    assert s[129] >= 5 > s[130] and s[258] >= 1 > s[259] and s[484] >= 0.1 > s[485]
    assert s.log()[0].item() == pytest.approx(9.2, abs=0.05) and s.log()[-1].item() == pytest.approx(-10.1, abs=0.05)


def test_min_snr_and_p2_weights_match_their_formulas():
    s = torch.tensor([0.0, 0.5, 5.0, 20.0, 1e4], dtype=torch.float64)
    assert min_snr_eps_weight(s, 5.0).tolist() == pytest.approx([1.0, 1.0, 1.0, 0.25, 5e-4])  # min(SNR, 5) / SNR
    assert p2_eps_weight(s, 1.0, 1.0).tolist() == pytest.approx([1.0, 1 / 1.5, 1 / 6, 1 / 21, 1 / 10001])
    # x0 and v parameterisations (Hang et al. 2023): min(SNR, g) and min(SNR, g) / (SNR + 1)
    assert objective_weights(s[1:], "min_snr", "sample").tolist() == pytest.approx([0.5, 5.0, 5.0, 5.0])
    assert objective_weights(s[1:], "min_snr", "v_prediction").tolist() == \
        pytest.approx([0.5 / 1.5, 5 / 6, 5 / 21, 5 / 10001])
    # P2 gamma=1 on the linear schedule, as quoted in the notes: w(0) ~ 1e-4, w(100) ~ 0.10, w(300) ~ 0.61
    cfg = TrainConfig(**PRESETS["cpu-tiny16"], loss_weighting="p2")
    tables = DiffusionTables.build(build_noise_scheduler(cfg).alphas_cumprod, cfg, "cpu")
    assert tables.weight[0].item() == pytest.approx(1e-4, rel=0.05)
    assert tables.weight[100].item() == pytest.approx(0.10, abs=0.01)
    assert tables.weight[300].item() == pytest.approx(0.61, abs=0.01)


def test_iddpm_probabilities_from_a_known_history():
    s = IDDPMSampler(4, "cpu")
    t = torch.tensor([0, 1, 2, 3] * 10)
    loss = torch.tensor([1.0, 2.0, 3.0, 4.0] * 10)
    loss[3] = 0.0  # t = 3 history: nine 4s and one 0
    for _ in range(10):  # warm-up checks happen every 10 updates
        s.observe(t, loss)
    rms = torch.tensor([1.0, 2.0, 3.0, math.sqrt(9 * 16 / 10)])
    expected = 0.999 * rms / rms.sum() + 0.001 / 4
    assert s.probabilities().tolist() == pytest.approx(expected.tolist(), rel=1e-6)
    assert s.weight_of(torch.tensor([0])).item() == pytest.approx(1 / (4 * expected[0].item()), rel=1e-6)


def test_iddpm_is_uniform_until_every_history_is_full():
    s = IDDPMSampler(4, "cpu")
    for _ in range(10):
        s.observe(torch.tensor([0, 1, 2] * 10), torch.ones(30))  # t = 3 never seen
    assert torch.equal(s.probabilities(), torch.full((4,), 0.25))


def test_iddpm_keeps_the_last_ten_losses_of_each_t():
    s = IDDPMSampler(2, "cpu")
    s.observe(torch.tensor([0] * 25 + [1] * 10), torch.cat([torch.arange(25.0), torch.ones(10)]))
    assert sorted(s.history[0].tolist()) == list(range(15, 25))


def test_edm2_uncertainty_learns_the_log_of_the_expected_loss():
    sampler, _ = make("edm2_uncertainty", uncertainty_lr=0.05)
    g = torch.Generator().manual_seed(0)
    for step in range(600):
        t, _ = draw(sampler, 1024, torch.Generator().manual_seed(step))
        sampler.observe(t, synthetic_loss(t, g))
    centres = torch.arange(sampler.num_bins) * (T // sampler.num_bins) + T // sampler.num_bins // 2
    expected = (0.02 + 0.5 * torch.exp(-centres.float() / 80)).log()  # E[L] of the synthetic losses
    err = (sampler.u.detach() - expected)[5:]  # the steep first bins' average differs from the centre value
    assert err.abs().mean() < 0.08 and err.abs().max() < 0.3
    assert sampler.u.detach()[0] > sampler.u.detach()[-1] + 1.5  # large loss at small t -> large u


@pytest.mark.slow
def test_two_gloo_ranks_with_different_losses_hold_identical_sampler_state():
    from conftest import run_cli

    proc = run_cli("tests.helpers.rank_consistency", [], nproc=2)
    assert proc.stdout.count(": OK") == 2
    global_draws = [n for n, cls in METHODS.items() if "batch" not in cls.needs]  # all but kim2025 (per image)
    assert "adaptive" in global_draws and len(global_draws) >= 5
    assert proc.stdout.count("state identical across ranks") == 2 * len(global_draws)


def test_speed_constants_weights_and_sampling_mass_from_the_paper():
    from adaptive.timesteps.speed import dual_timesteps

    s, _ = make("speed")
    assert s.m == 642  # first t with d/dt sqrt(1 - abar) < 1e-4, plus one (SpeeD's code, linear schedule)
    assert s.tau == 699  # our derivation; the SpeeD configs hand-set 700
    w = s.w
    assert w[0].item() == pytest.approx(0.409, abs=0.002) and w[219].item() == pytest.approx(0.6, abs=1e-4)
    assert w[699:].eq(1).all() and (w[:699] >= 0.4).all() and (w[:699] <= 0.6 + 1e-6).all()
    # asymmetric proposal: k = 5 below tau -> P(t < tau) = 5 tau / (5 tau + T - tau)
    assert s.p[:699].sum().item() == pytest.approx(5 * 699 / (5 * 699 + 301), rel=1e-5)
    # dual sampling: n//2 + 1 draws then mirrors |m - t|, truncated to n; every mirror is <= m
    t0 = torch.tensor([0, 100, 700, 999, 5])
    assert dual_timesteps(t0, 642, 8).tolist() == [0, 100, 700, 999, 5, 642, 542, 58]
    t, wt = draw(s, 128, torch.Generator().manual_seed(0))
    assert (t[65:] <= 642).all() and torch.equal(wt, s.w[t])  # 65 originals, 63 mirrors; no 1/p correction
    marginal = s.probabilities()
    assert marginal.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert marginal[:642].sum().item() == pytest.approx(0.921, abs=0.002)  # the notes' 92% below 642


def test_kim2025_pieces_match_the_paper_and_code():
    from adaptive.timesteps.kim2025 import BetaPolicy, kl_coefficients, pearson_scores, sample_gamma

    policy = BetaPolicy(16)
    a, b = policy(torch.randn(4, 3, 16, 16))
    # Beta(0.974, 0.974) at init
    assert torch.allclose(a, torch.full((4,), 0.97410), atol=1e-4) and torch.allclose(b, a)
    g = torch.Generator().manual_seed(0)
    for alpha in (0.5, 0.974, 3.0):
        x = sample_gamma(torch.full((200_000,), alpha), g)
        assert x.mean().item() == pytest.approx(alpha, rel=0.02) and x.var().item() == pytest.approx(alpha, rel=0.05)
    from diffusers import DDPMScheduler

    c = kl_coefficients(DDPMScheduler(num_train_timesteps=1000).betas)  # bits/dim per unit eps-MSE, fixed-large
    for t, value in ((0, 1.32), (1, 0.39), (2, 0.28), (10, 0.098), (100, 0.014), (999, 0.015)):
        assert c[t].item() == pytest.approx(value, rel=0.06), t
    X = torch.randn(20, 6, generator=g)
    y = 3 * X[:, 4] + 0.1 * torch.randn(20, generator=g)
    assert torch.topk(pearson_scores(X, y), 1).indices.item() == 4


def test_adaptive_objective_weights_balance_bins_and_keep_a_unit_loss_scale():
    from adaptive.timesteps.adaptive import balance_weights, proposal, stratified_bins

    m1 = torch.tensor([0.5, 0.1, 0.01, 0.002])
    lam = balance_weights(m1, 1.0, "unit")
    assert torch.allclose(lam * m1, torch.ones(4))  # beta = 1: every bin contributes equally, expected loss 1
    lam = balance_weights(m1, 0.5, "unit")
    assert (lam * m1).mean().item() == pytest.approx(1.0) and torch.allclose(lam[0] / lam[1], (m1[1] / m1[0]).sqrt())
    assert torch.allclose(balance_weights(m1, 0.0, "unit"), torch.full((4,), 1 / m1.mean().item()))
    # floor 1: the high-noise (low-loss) bins are boosted as by the balance, no bin is below the configured weight
    plain, floored = balance_weights(m1, 0.5, "unit"), balance_weights(m1, 0.5, "unit", floor=1.0)
    assert (floored * m1).mean().item() == pytest.approx(1.0)
    ratio = floored / torch.maximum(plain, 1 / m1.mean())  # proportional to max(balanced, configured) weights
    assert torch.allclose(ratio, ratio[0].expand(4)) and not torch.allclose(floored, plain)
    low, high = m1.argmin(), m1.argmax()
    assert floored[low] / floored[high] < plain[low] / plain[high] and floored[low] / floored[high] > 1
    p = proposal(torch.ones(4), torch.tensor([2.0, 1.0, 0.0, 1.0]), 0.2)
    assert torch.allclose(p, 0.8 * torch.tensor([0.5, 0.25, 0.0, 0.25]) + 0.05)
    # stratified draws: every stratum of the CDF gets exactly its share (up to one draw per bin)
    b = stratified_bins(torch.tensor([0.5, 0.25, 0.125, 0.125]), 64, torch.Generator().manual_seed(0))
    assert torch.bincount(b, minlength=4).tolist() == [32, 16, 8, 8]


def test_adaptive_anneals_from_gradient_balance_to_the_configured_objective():
    sampler = train_sampler(make("adaptive", adaptive_balance=0.5)[0], steps=60)  # beta 0.5 -> 0 over the run
    m1 = sampler.m1.clone()
    sampler.set_fraction(0.0)
    lam = sampler.objective_weights()[:: sampler.width]
    assert torch.allclose(lam / lam[0], (m1 / m1[0]).pow(-0.5), rtol=1e-4)  # lambda ~ E[L]^-1/2 at the start
    sampler.set_fraction(0.5)
    assert sampler.beta == pytest.approx(0.25)
    sampler.set_fraction(1.0)  # at the end: the configured objective, only rescaled
    lam = sampler.objective_weights()
    assert torch.allclose(lam / lam[0], torch.ones_like(lam))
    p, w = sampler.probabilities().double(), sampler.weight_of(torch.arange(T)).double()
    f = torch.rand(T, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert (p * w * f).sum().item() == pytest.approx((lam.double() * f).mean().item(), rel=1e-5)


@pytest.mark.parametrize("kind, moment", [("loss", "m2"), ("grad", "m1")])
def test_adaptive_proposal_power_raises_the_statistic_and_keeps_the_objective(kind, moment):
    """p ~ lambda x stat^gamma (+ the uniform floor), stat = sqrt(E[L^2]) or sqrt(E[L]); gamma changes only where the
    draws go: lambda (the declared objective) and the product p x weight are the same for every gamma."""
    state = train_sampler(make("adaptive", adaptive_proposal=kind)[0], steps=60).state_dict()
    runs = {g: make("adaptive", adaptive_proposal=kind, adaptive_proposal_power=g)[0] for g in (0.0, 0.5, 1.0, 2.0)}
    for s in runs.values():  # the same statistics, read with each power
        s.load_state_dict(state)
    t = torch.arange(T)
    for g, s in runs.items():
        lam = s.objective_weights()[:: s.width].double()
        stat = getattr(s, moment).double().sqrt() ** g
        want = lam * stat / (lam * stat).sum() * (1 - s.uniform_mix) + s.uniform_mix / s.num_bins
        assert torch.allclose(s.probabilities()[:: s.width].double() * s.width, want, rtol=1e-5), g
        assert torch.allclose(s.objective_weights(), runs[1.0].objective_weights(), rtol=1e-5), g
        assert torch.allclose(s.probabilities() * s.weight_of(t) * T, s.objective_weights(), rtol=1e-5), g
    assert not torch.allclose(runs[0.5].probabilities(), runs[1.0].probabilities(), rtol=1e-3)  # it does move them
    from adaptive.config import ConfigError, validate
    with pytest.raises(ConfigError, match="--adaptive_proposal_power must be in"):
        validate(TrainConfig.from_dict({**PRESETS["cpu-tiny16"], "timestep_sampler": "adaptive",
                                        "adaptive_proposal_power": -1.0}))


def test_adaptive_loss_scale_multiplies_every_weight_and_leaves_the_draws_alone():
    """--adaptive_loss_scale s: the expected weighted loss is s instead of 1 (same proposal, same draws)."""
    plain, scaled = (train_sampler(make("adaptive", adaptive_loss_scale=s)[0], steps=60) for s in (1.0, 0.1))
    t = torch.arange(T)
    assert torch.allclose(scaled.weight_of(t), 0.1 * plain.weight_of(t))
    assert torch.allclose(scaled.objective_weights(), 0.1 * plain.objective_weights())
    assert torch.allclose(scaled.probabilities(), plain.probabilities(), rtol=1e-6, atol=0)
    g1, g2 = (torch.Generator().manual_seed(5) for _ in range(2))
    assert torch.equal(draw(scaled, 64, g1)[0], draw(plain, 64, g2)[0])
    m1 = scaled.m1.repeat_interleave(scaled.width)  # unit normalisation now targets s
    assert (scaled.objective_weights() * m1).mean().item() == pytest.approx(0.1, rel=1e-5)
    from adaptive.config import ConfigError, validate
    with pytest.raises(ConfigError, match="--adaptive_loss_scale must be > 0"):  # checked once, with the config
        validate(TrainConfig.from_dict({**PRESETS["cpu-tiny16"], "timestep_sampler": "adaptive",
                                        "adaptive_loss_scale": 0.0}))


def test_adaptive_anneal_fraction_reaches_the_final_balance_early_and_stays():
    sampler = make("adaptive", adaptive_balance=0.5, adaptive_anneal_fraction=0.5)[0]
    betas = []
    for progress in (0.0, 0.25, 0.5, 0.75, 1.0):
        sampler.set_fraction(progress)
        betas.append(sampler.beta)
    assert betas == pytest.approx([0.5, 0.25, 0.0, 0.0, 0.0])
    assert "over 0.5 of the run" in sampler.describe()["objective"]


def drive_scale_rule(sampler, unit_norms, seed: int = 0):
    """Feed the loop's quantities: the step's gradient norm is s (the scale the step was trained with) x the unit-scale
    norm the model would give; returns the norms the loop logged, the scale after each step and the rule's own
    smoothed norm s x gbar after each step."""
    g, logged, scales, smoothed = torch.Generator().manual_seed(seed), [], [], []
    for step, u in enumerate(unit_norms):
        t, _ = draw(sampler, 256, torch.Generator().manual_seed(1000 + step))
        norm = (sampler.scale if sampler.updates >= sampler.warmup else torch.tensor(1.0)) * u
        logged.append(float(norm))
        sampler.observe(t, synthetic_loss(t, g), grad_norm=torch.tensor(float(norm)))
        scales.append(float(sampler.scale))
        smoothed.append(float(sampler.scale * sampler.unit_norm))
    return logged, scales, smoothed


def rising_then_falling(n: int = 300, peak: float = 3.0, seed: int = 1) -> list[float]:
    """A unit-scale gradient norm like cpu-tiny16's: rises to a peak, then decays, with step-to-step noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(0, 1, n)
    curve = 0.5 + (peak - 0.5) * torch.exp(-((x - 0.3) / 0.15) ** 2).where(x < 0.3, torch.exp(-(x - 0.3) / 0.4))
    return (curve * (1 + 0.1 * torch.randn(n, generator=g))).tolist()


def test_adaptive_clip_anchored_scale_puts_the_smoothed_gradient_norm_peak_at_the_clip_threshold():
    """The rule (docs/adaptive.md): s = max_grad_norm / max_k gbar_k. After the warm-up the smoothed norm never exceeds
    the threshold and touches it at the peak; past the peak the logged norm falls with the model's gradient, below
    the threshold; s never increases."""
    sampler = make("adaptive", adaptive_warmup_steps=10, max_grad_norm=1.0)[0]
    unit = rising_then_falling()
    logged, scales, smoothed = drive_scale_rule(sampler, unit)
    assert max(smoothed[10:]) == pytest.approx(1.0, abs=1e-6) and all(x <= 1.0 + 1e-6 for x in smoothed[10:])
    past_peak = torch.tensor(logged[int(0.3 * len(unit)) + 30:])
    assert past_peak.mean() < 1.0 and past_peak[-30:].mean() < 0.6  # decays with the gradient, rarely clipped
    assert all(b <= a + 1e-7 for a, b in zip(scales[11:], scales[12:]))  # s only ever decreases
    assert float(sampler.scale) == pytest.approx(1.0 / float(sampler.unit_norm_peak))
    assert sampler.diagnostics()["loss_scale"] == sampler.scale


def test_adaptive_loss_scale_rule_has_no_constant_tied_to_the_model():
    """A model whose gradients are 10x larger gets a 10x smaller scale and the very same logged norms (so the same
    clipping); the threshold sets the level: max_grad_norm 0.5 halves every norm; without clipping c = 1."""
    unit = rising_then_falling()
    base = drive_scale_rule(make("adaptive", adaptive_warmup_steps=10)[0], unit)
    big_model = make("adaptive", adaptive_warmup_steps=10)[0]
    big = drive_scale_rule(big_model, [10 * u for u in unit])
    assert big[0][11:] == pytest.approx(base[0][11:], rel=1e-5)  # step 10 is the first at the initial scale
    assert big[1][-1] == pytest.approx(base[1][-1] / 10, rel=1e-5)
    half = drive_scale_rule(make("adaptive", adaptive_warmup_steps=10, max_grad_norm=0.5)[0], unit)
    assert half[0][11:] == pytest.approx([0.5 * x for x in base[0][11:]], rel=1e-5)
    free = drive_scale_rule(make("adaptive", adaptive_warmup_steps=10, max_grad_norm=0.0)[0], unit)
    assert free[1] == pytest.approx(base[1], rel=1e-6)


def test_adaptive_loss_scale_rule_skips_non_finite_norms_and_round_trips():
    sampler = make("adaptive", adaptive_warmup_steps=2)[0]
    drive_scale_rule(sampler, [1.0, 1.0, 2.0, 3.0])
    before = float(sampler.scale)
    t, _ = draw(sampler, 64, torch.Generator().manual_seed(0))
    for bad in (math.inf, math.nan):
        sampler.observe(t, torch.ones(64), grad_norm=torch.tensor(bad))
        assert float(sampler.scale) == before and torch.isfinite(sampler.unit_norm_peak)
    clone = make("adaptive", adaptive_warmup_steps=2)[0]
    clone.load_state_dict(sampler.state_dict())
    assert torch.equal(clone.weight_of(torch.arange(T)), sampler.weight_of(torch.arange(T)))
    fixed = make("adaptive", adaptive_warmup_steps=2, adaptive_loss_scale=0.3)[0]
    drive_scale_rule(fixed, [1.0, 1.0, 2.0, 30.0])
    assert float(fixed.scale) == pytest.approx(0.3)  # a fixed scale ignores the norms
