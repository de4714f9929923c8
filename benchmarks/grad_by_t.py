"""Per-timestep gradient norms of a training checkpoint, and how far each timestep proposal is from variance-optimal.

The adaptive method draws t from p_b = 0.9 q_b / sum q + 0.1 / B with q_b = lambda_b sqrt(E[L_b^2]) (the RMS of the
weighted loss, docs/adaptive.md), a *proxy* for the per-sample gradient norm. For an unbiased importance-sampled
gradient g = lambda_b / (B p_b) grad L, the second moment per draw is

    M(p) = (1/B^2) sum_b lambda_b^2 G_b / p_b,      G_b = E ||grad_theta L_b||^2,

minimised by p*_b proportional to lambda_b sqrt(G_b) (the classical importance-sampling optimum; e.g. Katharopoulos
& Fleuret 2018, eq. 6). This script measures G_b directly - one backward pass per sample, on the checkpoint's online
(not EMA) weights, fp32 - together with the loss moments of the same samples, and reports M(p) / M(p*) for the
uniform proposal, the method's loss-RMS proposal, the sqrt(E[L]) ("grad") proposal, and the optimum with the same
10% uniform mix. A ratio near 1 means the proposal leaves no variance on the table; the log-log slope of sqrt(G_b)
against E[L_b] says which power of the loss the gradient norm follows.

    python benchmarks/grad_by_t.py --checkpoint RUN/checkpoint-1006 --data ../shared/datasets/cifar10-jpeg/train.zip \
        --out docs/benchmarks/dev/<date>/grad_by_t_<name>.json

Diagnostic only (a development tool): nothing in training depends on it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from adaptive.checkpoint import read_config
from adaptive.config import TrainConfig
from adaptive.data import decode_all, open_entries, to_model_input
from adaptive.model import build_noise_scheduler, build_unet
from adaptive.timesteps.adaptive import AdaptiveOptions, balance_weights, proposal
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's


def second_moment(lam: torch.Tensor, G: torch.Tensor, p: torch.Tensor) -> float:
    """M(p) = (1/B^2) sum_b lambda_b^2 G_b / p_b: second moment of the importance-sampled gradient per draw."""
    B = lam.numel()
    return float((lam ** 2 * G / p).sum() / B ** 2)


def param_groups(model) -> dict[str, list[torch.nn.Parameter]]:
    """The U-Net's parameters by top-level block (down_blocks.0, ..., mid_block, up_blocks.2, conv_out, ...)."""
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] in ("down_blocks", "up_blocks") else parts[0]
        groups.setdefault(key, []).append(p)
    return groups


def measure(model, x0: torch.Tensor, abar: torch.Tensor, bins: int, per_bin: int, T: int, gen: torch.Generator):
    """Per bin: mean loss, mean squared loss, and per parameter group the mean squared per-sample gradient norm
    (eps-MSE, one sample per backward pass)."""
    groups = param_groups(model)
    names = list(groups)
    flat = [p for n in names for p in groups[n]]
    sizes = [len(groups[n]) for n in names]
    m1, m2 = torch.zeros(bins), torch.zeros(bins)
    G = torch.zeros(len(names), bins)
    width = T // bins
    for b in range(bins):
        for _ in range(per_bin):
            i = int(torch.randint(len(x0), (1,), generator=gen))
            t = b * width + int(torch.randint(width, (1,), generator=gen))
            x = x0[i : i + 1]
            eps = torch.randn(x.shape, generator=gen)
            xt = abar[t].sqrt() * x + (1 - abar[t]).sqrt() * eps
            pred = model(xt, torch.tensor([t])).sample
            loss = ((pred - eps) ** 2).mean()
            grads = iter(torch.autograd.grad(loss, flat))
            for k, n in enumerate(sizes):
                G[k, b] += sum(float((next(grads) ** 2).sum()) for _ in range(n)) / per_bin
            L = float(loss.detach())
            m1[b] += L / per_bin
            m2[b] += L * L / per_bin
    return m1, m2, dict(zip(names, G))


def proposals(m1: torch.Tensor, m2: torch.Tensor, G: torch.Tensor, lam: torch.Tensor, mix: float) -> dict:
    """The candidate proposals over bins: uniform, the method's loss RMS, sqrt(E[L]), and the optimum for G."""
    B = m1.numel()
    return {"uniform": torch.full((B,), 1.0 / B),
            "loss_rms (the method)": proposal(lam, m2.sqrt(), mix),
            "sqrt_loss (grad proxy)": proposal(lam, m1.sqrt(), mix),
            "optimal (same mix)": proposal(lam, G.sqrt(), mix),
            "optimal (no mix)": proposal(lam, G.sqrt(), 0.0)}


def analyse(m1, m2, G_by_group: dict, beta: float, mix: float) -> dict:
    """Second moments of the candidate proposals relative to the optimum (whole gradient), per parameter group
    relative to uniform draws, and the log-log slope of sqrt(G) on E[L]."""
    lam = balance_weights(m1, beta, "mean")  # mean 1: the reported ratios do not depend on the normalisation
    B = m1.numel()
    G = sum(G_by_group.values())
    props = proposals(m1, m2, G, lam, mix)
    best = second_moment(lam, G, props["optimal (no mix)"])
    x, y = m1.log(), 0.5 * G.log()
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    per_group = {n: {k: second_moment(lam, g, p) / second_moment(lam, g, props["uniform"]) for k, p in props.items()
                     if not k.startswith("optimal")} for n, g in G_by_group.items()}
    return {"beta": beta, "second_moment_over_optimal": {k: second_moment(lam, G, p) / best for k, p in props.items()},
            "second_moment_over_uniform_by_group": per_group,
            "slope_log_sqrtG_vs_log_meanloss": slope,
            "mass_t_lt_100": {k: float(p[: max(1, B // 10)].sum()) for k, p in props.items()}}


def summarize(paths: list[Path]) -> str:
    """A markdown table of result files: per parameter group, its share of sum_b G_b and each proposal's second moment
    relative to uniform draws (the optimum with the method's 10% mix, per group, for reference)."""
    lines = []
    for path in paths:
        r = json.loads(path.read_text())
        m1 = torch.tensor(r["mean_loss"])
        lam = balance_weights(m1, r["beta"], "mean")
        by_group = {n: torch.tensor(g) for n, g in r["mean_sq_grad_norm_by_group"].items()}
        total = sum(float(g.sum()) for g in by_group.values())
        whole = r["second_moment_over_optimal"]
        lines += [f"**{path.name}** (step {r['step']}, beta {r['beta']:.3f}, {r['bins']} bins x {r['per_bin']} "
                  f"samples). Whole gradient, second moment over the optimum's: uniform {whole['uniform']:.2f}, "
                  f"loss RMS (the method) {whole['loss_rms (the method)']:.2f}, sqrt(E[L]) "
                  f"{whole['sqrt_loss (grad proxy)']:.2f}; slope of log sqrt(G) on log E[L] "
                  f"{r['slope_log_sqrtG_vs_log_meanloss']:.2f}.", "",
                  "| parameter group | share of sum G | loss RMS / uniform | sqrt(E[L]) / uniform "
                  "| optimum / uniform |",
                  "|---|---|---|---|---|"]
        for n, g in by_group.items():
            u = second_moment(lam, g, torch.full_like(g, 1.0 / g.numel()))
            opt = second_moment(lam, g, proposal(lam, g.sqrt(), 0.1)) / u
            d = r["second_moment_over_uniform_by_group"][n]
            lines.append(f"| {n} | {float(g.sum()) / total:.3f} | {d['loss_rms (the method)']:.2f} | "
                         f"{d['sqrt_loss (grad proxy)']:.2f} | {opt:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summarize", type=Path, nargs="+", help="only print a markdown table of these result files")
    ap.add_argument("--checkpoint", type=Path, help="an accelerate checkpoint folder of a training run")
    ap.add_argument("--data", type=Path, help="the training images (zip or folder)")
    ap.add_argument("--bins", type=int, default=50)
    ap.add_argument("--per_bin", type=int, default=16)
    ap.add_argument("--images", type=int, default=2000, help="images decoded to draw x0 from")
    ap.add_argument("--beta", type=float, default=None, help="balance exponent of lambda (default: the run's value "
                                                             "at the checkpoint's step, annealed linearly)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if not (args.checkpoint and args.data and args.out):
        ap.error("--checkpoint, --data and --out are required (or --summarize FILES)")

    raw = read_config(args.checkpoint)
    cfg = TrainConfig.from_dict({**raw, "train_data_dir": str(args.data)}, strict=False)
    opts = cfg.timestep_options if isinstance(cfg.timestep_options, AdaptiveOptions) else AdaptiveOptions()
    model = build_unet(cfg)
    model.load_state_dict(load_file(str(args.checkpoint / "model.safetensors")))
    model.train()
    step = int(args.checkpoint.name.rsplit("-", 1)[-1])
    if args.beta is None:
        b0, b1 = opts.adaptive_balance, opts.adaptive_balance_final
        frac = min(1.0, step / (cfg.max_train_steps * opts.adaptive_anneal_fraction))
        args.beta = b0 if b1 is None else b0 + (b1 - b0) * frac
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    x0 = to_model_input(decode_all(open_entries(cfg), cfg.resolution, limit=args.images), None, cfg.resolution)
    abar = build_noise_scheduler(cfg).alphas_cumprod.float()
    m1, m2, G = measure(model, x0, abar, args.bins, args.per_bin, cfg.ddpm_num_steps, gen)
    result = {"checkpoint": str(args.checkpoint), "step": step, "bins": args.bins, "per_bin": args.per_bin,
              "mean_loss": m1.tolist(), "mean_sq_loss": m2.tolist(),
              "mean_sq_grad_norm": sum(G.values()).tolist(),
              "mean_sq_grad_norm_by_group": {n: g.tolist() for n, g in G.items()},
              **analyse(m1, m2, G, args.beta, opts.adaptive_uniform_mix)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    shown = {k: v for k, v in result.items() if not isinstance(v, (list, dict)) or k.startswith("second")}
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
