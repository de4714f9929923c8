"""throughput.py's report: README.md (training, sampling, method costs, memory), ablations.md and the bar charts."""

from __future__ import annotations

import os
from pathlib import Path

from .workers import VARIANTS

TRAIN_HEADER = "| preset | batch | loop | precision | img/s | vs conventional | first call s | peak MB |"
SAMPLE_HEADER = "| preset | batch | steps | sampler | precision | img/s | vs pipeline | first call s |"


REFERENCE_LABEL = "img/s vs reference (conventional loop / DDPMPipeline = 1)"


def speed_bars(res: dict) -> list[tuple[str, float]]:
    """(label, speed-up over its reference) of every measured training and sampling kind, per preset."""
    bars = [(f"train\n{p}\n{k.replace('train-', '')}", v["speedup"]) for p, r in res.get("train", {}).items()
            for k, v in r.items() if isinstance(v, dict)]
    return bars + [(f"sample\n{p}\n{k.replace('sample-', '')}", v["speedup"]) for p, r in res.get("sample", {}).items()
                   for k, v in r.items() if isinstance(v, dict)]


def write_plot(res: dict, path: Path, ylabel: str = REFERENCE_LABEL) -> None:
    """Bar charts: every kind's speed-up over its reference (conventional loop / DDPMPipeline), per preset; each
    timestep method's per-step cost ratio with the range of its blocks. Nothing is written when neither was
    measured."""
    bars, costs = speed_bars(res), res.get("methods") or {}
    if not bars and not costs:
        return
    import matplotlib  # slow import (seconds): only when a plot is written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("speed", "cost") if (bars if p == "speed" else costs)]
    widths = [max(6, 1.1 * len(bars)) if p == "speed" else max(5, 0.8 * len(costs)) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.5), dpi=110, squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, panel in zip(axes[0], panels):
        if panel == "speed":
            ax.bar(range(len(bars)), [b[1] for b in bars],
                   color=["tab:gray" if b[1] == 1.0 else "tab:blue" for b in bars])
            ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
            ax.set_ylabel(ylabel, fontsize=8)
        else:
            ratios = [c["cost_ratio"] for c in costs.values()]
            low = [r - min(c.get("block_ratios") or [r]) for r, c in zip(ratios, costs.values())]
            high = [max(c.get("block_ratios") or [r]) - r for r, c in zip(ratios, costs.values())]
            ax.bar(range(len(costs)), ratios, yerr=[low, high], capsize=3, color="tab:orange")
            ax.set_xticks(range(len(costs)), list(costs), fontsize=7, rotation=30)
            ax.axhline(1.02, color="black", lw=0.8, ls="--", label="1.02 (PROTOCOL.md: uniform's step counts)")
            ax.set_ylim(0.8, max(1.1, *(r + h for r, h in zip(ratios, high))) + 0.05)
            ax.set_ylabel("per-step cost / uniform's (median of blocks; whiskers: block range)", fontsize=8)
            ax.legend(fontsize=7, loc="upper left")
        ax.axhline(1.0, color="black", lw=0.8)
    fig.suptitle(f"Throughput {res['date']} ({res['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fmt_load(load) -> str:
    return "/".join(f"{x:.1f}" for x in load) if load else "?"


def kept_presets(res: dict, section: str, commit: str) -> str:
    """' (P: commit c, ...)' for the presets of a section kept from an earlier run (`--only` re-measured the others)."""
    per_preset = res.get(section) if isinstance(res.get(section), dict) else {}  # train, sample (not methods, memory)
    kept = [f"{p}: commit `{r['git_commit'][:7]}`" for p, r in per_preset.items()
            if isinstance(r, dict) and r.get("git_commit", commit) != commit]
    return f" ({', '.join(kept)} kept from an earlier run)" if kept else ""


def header(res: dict) -> list[str]:
    """Title, command, how img/s and memory are measured, load; the sections measured separately; partial runs."""
    sections = res.get("sections", {})
    separate = (len({v["git_commit"] for v in sections.values()}) > 1
                or any(v.get("command") != res["command"] for v in sections.values()))
    return [f"# Throughput ({res['date']}, {res['machine']})", "",
            f"Command: `{res['command']}`; commit `{res['git_commit']}`; torch {res['versions']['torch']}. "
            "img/s = median over windows after warm-up; the kinds ran in fresh processes in rotating order (so load "
            "changes on this shared machine hit all of them). `-compile` = `--compile` (torch.compile); its one-off "
            "compilation is the 'first call' column, not part of img/s. Peak memory = process peak RSS on the CPU "
            "(includes the Python runtime and the dataset), CUDA max allocated on a GPU. "
            f"{'Plot: `throughput.png`. ' if speed_bars(res) or res.get('methods') else ''}"
            f"Load average (1/5/15 min) at start {fmt_load(res.get('load_average_start'))}, at end "
            f"{fmt_load(res.get('load_average_end'))} on {os.cpu_count()} CPUs.", "",
            *(["Sections measured separately (`--only`): " + "; ".join(
                f"{name}: commit `{v['git_commit'][:7]}`{kept_presets(res, name, v['git_commit'])}, load "
                f"{fmt_load(v.get('load_average_start'))} -> {fmt_load(v.get('load_average_end'))}"
                for name, v in sections.items()), ""] if separate else []),
            *([] if res.get("complete", True) else ["**Partial run**: the sections below are those measured before "
                                                      "it was stopped.", ""])]


def speed_table(title: str, header: str, runs: dict, cells) -> list[str]:
    """One speed table: a row per preset and measured kind, `cells(preset, run, kind, measured)` its columns."""
    if not runs:
        return []
    L = [title, "", header, "|" + "---|" * (header.count("|") - 1)]
    for preset, r in runs.items():
        for kind, v in r.items():
            if isinstance(v, dict):
                L.append("| " + " | ".join(str(c) for c in cells(preset, r, kind, v)) + " |")
    return L


def speed_tables(res: dict) -> list[str]:
    """Training (ours vs the conventional loop) and sampling (ours vs DDPMPipeline)."""
    def measured(v: dict) -> list[str]:
        return [v["mixed_precision"], f"{v['img_per_s']:.1f}", f"{v['speedup']:.2f}x",
                f"{v['first_call_seconds']:.1f}"]

    train = speed_table("## Training: our loop vs the conventional Diffusers-example loop", TRAIN_HEADER, res["train"],
                        lambda preset, r, kind, v: [preset, r["batch"], kind.replace("train-", ""), *measured(v),
                                                    f"{v['peak_memory_mb']:.0f}"])
    sample = speed_table("## Sampling: sample.py's path vs `DDPMPipeline(...)()` out of the box (same model, steps, "
                         "batch)", SAMPLE_HEADER, res["sample"],
                         lambda preset, r, kind, v: [preset, r["batch"], r["steps"], kind.replace("sample-", ""),
                                                     *measured(v)])
    return [*train, *([""] if train and sample else []), *sample]


def cost_and_memory_tables(res: dict) -> list[str]:
    """The timestep methods' per-step cost ratios and the memory table, where measured."""
    L = []
    if res.get("methods"):
        src = f" (measured by `{res['methods_source']}`, same code)" if res.get("methods_source") else ""
        clock = next(iter(res["methods"].values())).get("clock", "wall")
        L += ["", f"## Per-step cost of each timestep method relative to uniform (cpu-tiny16, one process, interleaved "
                  f"blocks, {'CPU' if clock == 'cpu' else 'wall-clock'} time){src}", "",
              "| method | s/step | cost ratio (median of blocks) | ratio per block |", "|---|---|---|---|"]
        for m, c in res["methods"].items():
            per_block = ", ".join(f"{r:.3f}" for r in c.get("block_ratios", []))
            L.append(f"| {m} | {c['seconds_per_step']:.4f} | {c['cost_ratio']:.3f} | {per_block} |")
    if res.get("memory"):
        L += ["", f"## Memory: {res.get('memory_preset', 'ddpm-cifar10')} on {res['memory'][0]['device']}", "",
              "| batch per device | precision | gradient checkpointing | peak MB | img/s |", "|---|---|---|---|---|"]
        for m in res["memory"]:
            L.append(f"| {m['batch']} | {m['mixed_precision']} | {m['gradient_checkpointing']} | "
                     f"{m['peak_memory_mb']:.0f} | {m['img_per_s']:.2f} |")
    return L


def write_readme(res: dict, path: Path) -> None:
    """README.md of a throughput run."""
    speed, rest = speed_tables(res), cost_and_memory_tables(res)
    path.write_text("\n".join([*header(res), *speed, *(rest if speed else rest[1:])]) + "\n")


def write_ablations(res: dict, out: Path) -> None:
    """ablations.md and ablations.png: our step with each optimisation switched back, against the default."""
    L = [f"# Ablations of our training step ({res['date']}, {res['machine']})", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`. img/s relative to our default step (bf16 "
         "autocast, `--attention_impl auto`: `matmul_attention` under CPU autocast, NCHW), each variant in fresh "
         f"processes in rotating order. Load average at start {fmt_load(res['load_average_start'])}, at end "
         f"{fmt_load(res['load_average_end'])} on {os.cpu_count()} CPUs.",
         "", "| preset | batch | variant | flags | img/s | vs default |", "|---|---|---|---|---|---|"]
    for preset, r in res["ablations"].items():
        for kind, v in r.items():
            if isinstance(v, dict):
                flags = " ".join(VARIANTS.get(kind, ("", []))[1]) or "(default)"
                L.append(f"| {preset} | {r['batch']} | {kind.replace('train-', '')} | `{flags}` | "
                         f"{v['img_per_s']:.1f} | {v['speedup']:.2f}x |")
    (out / "ablations.md").write_text("\n".join(L) + "\n")
    write_plot({**res, "train": res["ablations"]}, out / "ablations.png", ylabel="img/s vs our default step (= 1)")
