"""benchmarks/: the method comparison's arithmetic, and its --quick smoke run end to end."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.bench.costs import costs_to_measure
from benchmarks.bench.plans import make_plan
from benchmarks.bench.protocol import (ABLATIONS, CLAIM_METHODS, METHODS, calibration_budget, grid_name,
                                       grid_variants, in_blob_phase, plan, recheck_points, used_ratio, variants)
from benchmarks.bench.report import bar_verdict, long_lines, render_stored, write_readme
from benchmarks.bench.summary import aggregate, interpolate_crossing, select_tuned
from benchmarks.compare_methods import parse_args
from conftest import ROOT, tiny_args


def test_crossing_is_interpolated_between_evaluation_points():
    assert interpolate_crossing([500, 1000, 1500], [10.0, 6.0, 2.0], 4.0) == pytest.approx(1250)
    assert interpolate_crossing([500, 1000], [3.0, 2.0], 4.0) == 500
    assert interpolate_crossing([500, 1000], [9.0, 8.0], 4.0) is None


def test_budgets_scale_with_the_measured_cost_ratio():
    assert plan("x", 1.0, 2000, (500, 2000)) == (2000, [500, 2000])
    assert plan("x", 1.25, 2000, (500, 1000, 2000)) == (1600, [400, 800, 1600])
    # a ratio is used only when every block measured the method > 2% slower (the protocol's c <= 1.02 rule,
    # made robust to a noisy machine); otherwise the method gets the uniform step counts
    assert used_ratio({"cost_ratio": 1.04, "block_ratios": [1.2, 1.04, 0.97, 1.04, 1.17]}) == 1.0
    assert used_ratio({"cost_ratio": 1.34, "block_ratios": [1.34, 1.17, 1.10, 1.48, 1.34]}) == 1.34


def test_only_missing_or_remeasured_cost_ratios_are_measured_again():
    old = {m: {"cost_ratio": r} for m, r in (("uniform", 1.0), ("adaptive", 0.99), ("kim2025", 1.34))}
    # re-measuring one method must not touch the others' ratios: their finished runs were planned from them
    kept, todo = costs_to_measure(old, ["uniform", "adaptive", "kim2025"], ["adaptive"])
    assert kept == {"uniform": old["uniform"], "kim2025": old["kim2025"]} and todo == ["adaptive"]
    assert costs_to_measure(old, ["uniform", "kim2025", "p2"], []) == (old, ["p2"])
    assert costs_to_measure(None, ["adaptive"], []) == ({}, ["uniform", "adaptive"])


def test_speedup_is_uniform_budget_over_steps_to_uniforms_final_fd():
    rows = [{"method": "uniform", "seed": s, "cost_ratio": 1.0, "cost_ratio_used": 1.0, "steps": 2000,
             "evals": [{"step": 1000, "fd": 8.0 + s, "train_seconds": 60},
                       {"step": 2000, "fd": 4.0 + s, "train_seconds": 120}]}
            for s in (0, 1)]
    rows += [{"method": "fast", "seed": s, "cost_ratio": 1.25, "cost_ratio_used": 1.25, "steps": 1600,
              "evals": [{"step": 800, "fd": 4.5, "train_seconds": 60}, {"step": 1600, "fd": 3.0, "train_seconds": 120}]}
             for s in (0, 1)]
    summ = aggregate(rows, 2000, (1000, 2000))
    assert summ["uniform"]["curve"][-1]["mean"] == pytest.approx(4.5) \
        and summ["uniform"]["speedup"] == pytest.approx(1.0)
    assert summ["fast"]["equiv_steps_to_target"] == pytest.approx(1000)  # reaches 4.5 at its first point
    assert summ["fast"]["speedup"] == pytest.approx(2.0)


def curve_row(method: str, seed: int, fds: dict[int, float], planned=(1000, 2000), cost=1.0) -> dict:
    return {"method": method, "seed": seed, "cost_ratio": cost, "cost_ratio_used": cost, "steps": max(fds),
            "eval_steps": list(planned),
            "evals": [{"step": k, "fd": v, "train_seconds": k / 10} for k, v in fds.items()]}


def test_unfinished_runs_stay_out_of_the_means_and_the_bar_is_checked_honestly():
    rows = [curve_row("uniform", s, {1000: 8.0, 2000: 4.0 + 0.1 * s}) for s in (0, 1)]
    rows += [curve_row("adaptive", s, {1000: 3.0 + 0.1 * s, 2000: 2.0 + 0.1 * s}) for s in (0, 1)]
    rows += [curve_row("adaptive", 2, {1000: 99.0}), curve_row("p2", 0, {1000: 5.0, 2000: 3.0})]
    summ = aggregate(rows, 2000, (1000, 2000))
    assert summ["adaptive"]["seeds"] == [0, 1] and summ["adaptive"]["running"] == ["seed 2 at step 1000"]
    assert summ["adaptive"]["curve"][0]["mean"] == pytest.approx(3.05)  # the unfinished seed's 99 is not in it
    assert summ["adaptive"]["speedup_by_seed"] == {0: pytest.approx(2.0), 1: pytest.approx(2.0)}
    verdict = bar_verdict(summ)
    assert verdict[0].startswith("1. speed-up >= 2x against uniform: yes")
    # p2 has one seed: its gap to adaptive cannot be judged against a spread; unfinished baselines are named
    assert verdict[1].startswith("2. lower mean FD") and ": no (" in verdict[1] and "p2" in verdict[1] \
        and "kim2025" in verdict[1]
    rows[-1:] = [curve_row("p2", s, {1000: 5.0, 2000: 1.5}) for s in (0, 1)]
    assert "not lower than p2 1.500" in bar_verdict(aggregate(rows, 2000, (1000, 2000)))[1]


def test_uniform_tuned_is_the_grid_point_with_the_lowest_fd_at_the_budget_ties_to_the_earlier_transition():
    final = {n: 3.0 for n in grid_variants()}
    final[grid_name(4e-3, 0.99)] = 2.50
    final[grid_name(8e-3, 0.99)] = 2.51  # within 1%: a tie, and its transition is earlier
    early = {grid_name(8e-3, 0.99)}
    rows = [curve_row(n, 0, {1000: 4.0 if n in early else 9.0, 2000: fd}) for n, fd in final.items()]
    summ = aggregate(rows, 2000, (1000, 2000), reference=grid_name(2e-3, 0.999))
    sel = select_tuned(summ, 2000)
    assert sel["name"] == grid_name(8e-3, 0.99) and sel["learning_rate"] == 8e-3 and sel["adam_beta2"] == 0.99
    assert sel["tied"] == sorted([grid_name(4e-3, 0.99), grid_name(8e-3, 0.99)])
    final[grid_name(8e-3, 0.99)] = 2.60  # no longer a tie: the lowest FD wins whatever its transition
    rows = [curve_row(n, 0, {1000: 4.0 if n in early else 9.0, 2000: fd}) for n, fd in final.items()]
    assert select_tuned(aggregate(rows, 2000, (1000, 2000)), 2000)["name"] == grid_name(4e-3, 0.99)
    # an unfinished grid selects nothing
    assert select_tuned(aggregate(rows[:-1], 2000, (1000, 2000)), 2000) is None


def test_32px_budget_and_recheck_points_follow_the_protocol():
    curve = [(500 * i, fd) for i, fd in enumerate([11, 10, 9, 6, 4, 3.4, 3.2, 3.1, 3.0, 2.95, 2.9, 2.85], start=1)]
    # 1.15 x 2.85 = 3.28: first reached at 3,500 steps -> B = 4,000
    assert calibration_budget(curve) == 4000
    assert not in_blob_phase(curve)
    assert recheck_points({"learning_rate": 2e-3, "adam_beta2": 0.99}) == [grid_name(1e-3, 0.99), grid_name(4e-3, 0.99)]
    assert recheck_points({"learning_rate": 8e-3, "adam_beta2": 0.999}) == [grid_name(2e-3, 0.999),
                                                                             grid_name(4e-3, 0.999)]


def test_a_calibration_that_never_leaves_the_blob_phase_sets_b_6000_and_the_table_reports_exit_steps(tmp_path):
    # PROTOCOL.md 32 px: 6,000-step FD within 15% of the 1,000-step FD -> no budget to calibrate; B = 6,000 with
    # points 1,500 / 3,000 / 4,500 / 6,000. The plain rule would have given B = 1,000 (12.2 is within 15% of 11.5).
    blob = [(500 * i, fd) for i, fd in enumerate([12.2, 12.2, 12.3, 12.1, 12.1, 11.9, 11.8, 11.8, 11.7, 11.6, 11.6,
                                                  11.5], start=1)]
    assert in_blob_phase(blob) and calibration_budget(blob) == 6000
    leaving = blob[:-1] + [(6000, 10.0)]  # 10.0 is 18% below 12.2: it has started to leave
    assert not in_blob_phase(leaving) and calibration_budget(leaving) == 6000
    tuned, cal = tmp_path / "t.json", tmp_path / "c.json"
    tuned.write_text(json.dumps({"learning_rate": 2e-3, "adam_beta2": 0.99}))
    cal.write_text(json.dumps({"budget": 6000, "curve": blob}))
    pl = make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32", "--calibration", str(cal), "--seeds", "0",
                               "1"]))
    assert pl.budget == 6000 and pl.points == (1500, 3000, 4500, 6000) and pl.blob_phase
    recheck = make_plan(parse_args(["--calibrate", "--tuned", str(tuned), "--protocol", "32", "--calibration",
                                    str(cal)]))
    assert recheck.points == (1500, 3000, 4500, 6000)
    cal.write_text(json.dumps({"budget": 6000, "curve": leaving}))
    pl = make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32", "--calibration", str(cal), "--seeds", "0"]))
    assert pl.points == (1500, 3000, 3750, 4500, 5250, 6000) and not pl.blob_phase
    # the plan derives points and blob phase from the curve: stored ones that disagree with it are refused
    cal.write_text(json.dumps({"budget": 6000, "curve": leaving, "points": [1500, 3000, 4500, 6000],
                               "blob_phase": True}))
    with pytest.raises(ValueError, match=r"points \[1500, 3000, 4500, 6000\] \(its curve gives .*blob_phase True"):
        make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32", "--calibration", str(cal)]))
    cal.write_text(json.dumps({"budget": 4000, "curve": blob}))
    with pytest.raises(ValueError, match="budget 4000 .its curve gives 6000.*rerun --calibrate"):
        make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32", "--calibration", str(cal)]))

    # exit step = the first evaluation at FD <= 5; the reference never leaves -> budget / exit step, a lower bound
    def row(m, seed, fds):
        return {"method": m, "seed": seed, "cost_ratio": 1.0, "cost_ratio_used": 1.0, "steps": 6000,
                "eval_steps": list(BLOBP), "evals": [{"step": p, "fd": fd, "train_seconds": p} for p, fd in
                                                     zip(BLOBP, fds)]}
    BLOBP = (1500, 3000, 4500, 6000)
    rows = [row("uniform-tuned", 0, [12, 12, 11.8, 11.6]), row("uniform-tuned", 1, [12, 11.9, 4.0, 3.5]),
            row("adaptive", 0, [11.8, 4.9, 3.5, 3.0]), row("adaptive", 1, [11.9, 6.0, 3.6, 3.1])]
    summ = aggregate(rows, 6000, BLOBP, reference="uniform-tuned")
    a, u = summ["adaptive"], summ["uniform-tuned"]
    assert u["exit_step"] is None and a["exit_step"] == 4500  # mean curve: (4.9 + 6.0) / 2 > 5 at 3,000
    assert a["exit_speedup"] == pytest.approx(6000 / 4500) and a["exit_speedup_is_lower_bound"]
    assert a["exit_step_by_seed"] == {0: 3000, 1: 4500}
    # seed 0: uniform never leaves -> >= 2x; seed 1: uniform leaves at 4,500 too -> 1x, not a bound
    assert a["exit_speedup_by_seed"] == {0: {"speedup": 2.0, "lower_bound": True},
                                         1: {"speedup": 1.0, "lower_bound": False}}
    verdict = bar_verdict(summ, baselines=["uniform-tuned"], reference="uniform-tuned", blob_phase=True)
    assert verdict[0] == ("1. speed-up >= 2x against uniform-tuned: no (at least 1.33x in leaving the blob "
                           "phase: step 4500, uniform-tuned had not left it by the budget)")
    meta = {"date": "d", "command": "c", "git_commit": "g", "code_hash": "h", "seeds": [0, 1], "blob_phase": True,
            "machine": {"cpu": "x"}, "versions": {"torch": "t", "diffusers": "d"}, "reference": "uniform-tuned",
            "baselines": ["uniform-tuned"], "table": "dev"}
    write_readme(summ, meta, tmp_path / "README.md", 6000)
    text = (tmp_path / "README.md").read_text()
    assert "| adaptive | 4500 | >= 1.33x | 0: 3000, 1: 4500 | 0: >= 2.00x, 1: 1.00x |" in text
    assert "| uniform-tuned | not left | - | 0: not left, 1: 4500 |" in text and "never left it" in text
    write_readme(summ, {**meta, "blob_phase": False, "table": "long"}, tmp_path / "README.md", 6000)
    assert "| adaptive | 4500 | >= 1.33x |" in (tmp_path / "README.md").read_text()  # long runs show exit steps too
    write_readme(summ, {**meta, "blob_phase": False}, tmp_path / "README.md", 6000)
    assert "exit step" not in (tmp_path / "README.md").read_text()  # other tables: the bar's speed-up only


def test_claim_seeds_are_refused_outside_a_claim_table(tmp_path):
    with pytest.raises(ValueError, match="claim seeds"):
        make_plan(parse_args(["--seeds", "0", "13"]))
    with pytest.raises(ValueError, match="seeds \\[13, 14, 15\\]"):
        make_plan(parse_args(["--claim", "--seeds", "13", "14"]))
    with pytest.raises(ValueError, match="v3's claim tables"):  # v4: the spent v3 claim seeds in no new table
        make_plan(parse_args(["--seeds", "0", "10"]))
    with pytest.raises(ValueError, match="v3's claim tables"):
        make_plan(parse_args(["--claim", "--seeds", "10", "11", "12"]))
    assert make_plan(parse_args(["--seeds", "10", "11", "12", "--report_only"])).seeds == [10, 11, 12]
    tuned = tmp_path / "t.json"
    tuned.write_text(json.dumps({"learning_rate": 4e-3, "adam_beta2": 0.99}))
    pl = make_plan(parse_args(["--tuned", str(tuned), "--seeds", "0"]))
    assert pl.reference == "uniform-tuned" and pl.methods[0] == "uniform-tuned" and "uniform" not in pl.methods
    assert pl.budget == 2000 and pl.preset == "cpu-tiny16"
    dev = make_plan(parse_args(["--tuned", str(tuned), "--seeds", "0", "--methods", "uniform-tuned", "adaptive-tuned"]))
    cost_of, flags = variants(dev.tuned)["adaptive-tuned"]  # adaptive's defaults on uniform-tuned's optimiser
    assert cost_of == "adaptive" and flags[-4:] == ["--learning_rate", "0.004", "--adam_beta2", "0.99"]
    assert dev.baselines == ["uniform-tuned"]  # adaptive's own variant is shown beside it, not a baseline to beat
    assert "adaptive-tuned" not in make_plan(parse_args(["--tuned", str(tuned), "--seeds", "0", "--methods", "min_snr",
                                                          "adaptive", "adaptive-tuned"])).baselines
    with pytest.raises(ValueError, match="--calibration"):
        make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32"]))
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"budget": 4000}))
    pl = make_plan(parse_args(["--tuned", str(tuned), "--protocol", "32", "--calibration", str(cal)]))
    assert pl.preset == "cpu-tiny" and pl.points == (1000, 2000, 2500, 3000, 3500, 4000)
    tune = make_plan(parse_args(["--tune_uniform"]))
    assert tune.seeds == [0] and len(tune.methods) == 8 and tune.reference == grid_name(2e-3, 0.999)
    abl = make_plan(parse_args(["--ablation", "--seeds", "0"]))
    assert abl.methods[0] == "uniform" and abl.methods[-1] == "adaptive" and abl.reference == "uniform"

    # every ablation row is `adaptive` with parts switched off, and shares adaptive's measured cost ratio
    assert all(variants()[n][0] == "adaptive" and "adaptive" in variants()[n][1] for n in ABLATIONS)
    assert ["--adaptive_proposal", "uniform", "--no-adaptive_stratified"] == ABLATIONS["abl-norm-only"][-3:]
    # a dev table with an ablation row beside the method: the row is the method's variant, not a baseline it must beat
    side = make_plan(parse_args(["--tuned", str(tuned), "--methods", "uniform-tuned", "adaptive", "abl-balance0.5",
                                 "--seeds", "0"]))
    assert side.baselines == ["uniform-tuned"]


def test_a_claim_table_runs_the_protocol_s_methods_at_each_resolution(tmp_path, monkeypatch):
    import benchmarks.bench.plans as plans

    monkeypatch.setattr(plans, "dirty", lambda: False)  # a claim runs on a committed, clean tree
    tuned, cal = tmp_path / "t.json", tmp_path / "c.json"
    tuned.write_text(json.dumps({"learning_rate": 2e-3, "adam_beta2": 0.99}))
    cal.write_text(json.dumps({"budget": 6000}))
    claim = ["--claim", "--seeds", "13", "14", "15", "--tuned", str(tuned)]
    assert make_plan(parse_args(claim)).methods == ["uniform-tuned", "adaptive", "min_snr", "iddpm",
                                                    "edm2_uncertainty"]
    px32 = make_plan(parse_args([*claim, "--protocol", "32", "--calibration", str(cal)]))
    assert px32.methods == ["uniform-tuned", "adaptive", "min_snr", "edm2_uncertainty"] and px32.preset == "cpu-tiny"
    assert "p2" in make_plan(parse_args([*claim, "--methods", *CLAIM_METHODS["16"], "p2"])).methods  # added: fine
    with pytest.raises(ValueError, match="iddpm, edm2_uncertainty left out"):
        make_plan(parse_args([*claim, "--methods", "uniform-tuned", "adaptive", "min_snr"]))
    with pytest.raises(ValueError, match="give --tuned for uniform-tuned"):
        make_plan(parse_args(claim[:-2]))


def test_every_run_and_cost_measurement_trains_in_the_protocol_precision_unless_told_otherwise(tmp_path):
    """PROTOCOL.md v3 trains in fp32 on every CPU; the presets say bf16, so the benchmark must pass it to every run."""
    from benchmarks.bench.farm import train_command
    from train_accelerate import parse_args as train_args

    def precision(argv):
        args = parse_args(argv)
        args.tuned, args.preset = None, "cpu-tiny16"
        cmd = train_command("uniform", 0, tmp_path, 2000, [500, 1000], args)
        ran = train_args(cmd[2:]).mixed_precision
        assert args.mixed_precision == ran  # what results.json records is what the runs got
        return ran, args.extra

    assert precision([]) == ("no", ["--mixed_precision", "no"])  # the cost measurement gets args.extra too
    assert precision(["--mixed_precision", "bf16"])[0] == "bf16"
    assert precision(["--", "--mixed_precision", "bf16"])[0] == "bf16"  # a flag after -- wins, as before
    assert precision(["--", "--mixed_precision=fp16"])[0] == "fp16"


@pytest.mark.slow
def test_quick_mode_runs_every_stage(tmp_path):
    from conftest import PRECISION_FLAGS, run_cli

    out, work = tmp_path / "report", tmp_path / "work"
    argv = ["--quick", "--out", str(out), "--work", str(work), *(["--", *PRECISION_FLAGS] if PRECISION_FLAGS else [])]
    proc = run_cli("benchmarks/compare_methods.py", argv)
    assert "cost ratios: uniform 1.000, adaptive" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in res["rows"]} == {"uniform", "adaptive"}
    assert all(len(r["evals"]) == 2 and r["git_commit"] and r["code_hash"] for r in res["rows"])
    assert res["machine"]["cpu"] and res["versions"]["torch"]
    if not PRECISION_FLAGS:  # no flag after --: both runs trained in the protocol's fp32, not the preset's bf16
        assert res["mixed_precision"] == "no"
        assert {json.loads((work / "runs" / f"{m}_seed0" / "config.json").read_text())["mixed_precision"]
                for m in ("uniform", "adaptive")} == {"no"}
    assert (out / "fd_vs_time.png").stat().st_size > 1000
    table = (out / "README.md").read_text()
    assert "| uniform |" in table and "| adaptive |" in table and "QUICK SMOKE TEST" in table
    # a second invocation reuses the finished runs and the measured costs
    proc = run_cli("benchmarks/compare_methods.py", argv)
    assert "training runs" not in proc.stdout and "measuring cost" not in proc.stdout
    # a lost work folder (a new machine): the finished runs come back from the records kept beside the table
    kept = sorted(p.name for p in (out / "runs").iterdir())
    assert kept == sorted(f"{m}_seed0.{f}" for m in ("uniform", "adaptive") for f in ("stats.jsonl", "provenance.json",
                                                                                        "run_info.json", "segments.jsonl"))
    segments = {m: (out / "runs" / f"{m}_seed0.segments.jsonl").read_text() for m in ("uniform", "adaptive")}
    shutil.rmtree(work)
    proc = run_cli("benchmarks/compare_methods.py", argv)
    assert proc.stdout.count("restored the finished run") == 2 and "training runs" not in proc.stdout
    # the restored runs carry their launch records back, unchanged (a restore is not a new launch)
    assert {m: (work / "runs" / f"{m}_seed0" / "segments.jsonl").read_text() for m in segments} == segments
    again = json.loads((out / "results.json").read_text())
    assert [(r["method"], r["evals"]) for r in again["rows"]] == [(r["method"], r["evals"]) for r in res["rows"]]


@pytest.mark.slow
def test_throughput_quick_mode_compares_side_by_side(tmp_path, monkeypatch, capsys):
    import benchmarks.throughput as tp
    from benchmarks.bench import workers
    from conftest import run_cli

    out = tmp_path / "tp"
    bad = tmp_path / "costs.json"
    bad.write_text(json.dumps({"code_hash": "not-this-code", "costs": {}}))
    assert tp.main(["--quick", "--out", str(out), "--costs", str(bad)]) == 2 and not (out / "results.json").exists()
    assert "measured on other code" in capsys.readouterr().err
    run_cli("benchmarks/throughput.py", ["--quick", "--out", str(out)])  # real worker processes
    res = json.loads((out / "results.json").read_text())
    train, sample = res["train"]["cpu-tiny16"], res["sample"]["cpu-tiny16"]
    assert train["train-conventional"]["speedup"] == 1.0 and sample["sample-pipeline"]["speedup"] == 1.0
    for kind in ("train-ours", "sample-ours"):
        v = (train if kind.startswith("train") else sample)[kind]
        assert v["img_per_s"] > 0 and len(v["windows"]) == 2  # 1 round x 2 windows, in a fresh process
    assert train["train-conventional"]["mixed_precision"] == "no" and len(res["load_average_end"]) == 3
    assert train["git_commit"] == sample["git_commit"] == res["git_commit"]  # every preset's provenance
    assert (out / "throughput.png").stat().st_size > 1000
    table = (out / "README.md").read_text()
    assert "| cpu-tiny16 | 8 | ours |" in table and "| cpu-tiny16 | 8 | conventional |" in table \
        and "vs pipeline" in table
    # --only: re-measure one section, keep the others as they were (stand-in workers: the merge is what is tested)
    calls = []

    def fake_worker(kind, preset, data, batch, args, extra=()):
        calls.append(kind)
        return {"img_per_s": 7.0, "windows": [7.0, 7.0], "peak_memory_mb": 1.0, "mixed_precision": "no",
                "first_call_seconds": 0.0, "device": "cpu", "threads": 1}

    monkeypatch.setattr(workers, "run_worker", fake_worker)
    assert tp.main(["--quick", "--out", str(out), "--only", "sample"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert sorted(calls) == ["sample-ours", "sample-pipeline"]  # no training worker ran
    assert again["train"] == res["train"] and again["sample"]["cpu-tiny16"]["sample-ours"]["windows"] == [7.0, 7.0]
    assert "--only sample" in again["sections"]["sample"]["command"]
    assert "--only" not in again["sections"]["train"]["command"] and again["complete"]
    assert "Sections measured separately" in (out / "README.md").read_text()


def test_throughput_training_plan_and_flags_choose_kinds_batch_precision_and_reference(monkeypatch):
    import benchmarks.throughput as tp
    from benchmarks.bench import workers

    # defaults as before: no compilation of ddpm-cifar10 on a CPU, the fp32 conventional loop is the reference
    assert workers.train_plan(tp.parse_args([]), "ddpm-cifar10") == (16, ["train-ours", "train-conventional"],
                                                                     "train-conventional")
    assert workers.train_plan(tp.parse_args([]), "cpu-tiny")[1] == ["train-ours", "train-ours-compile",
                                                                    "train-conventional"]
    gpu = tp.parse_args(["--train_batch", "128", "--mixed_precision", "bf16", "--train_kinds", "train-ours-compile",
                         "train-conventional-bf16"])
    assert workers.train_plan(gpu, "ddpm-cifar10") == (128, ["train-ours-compile", "train-conventional-bf16"],
                                                  "train-conventional-bf16")
    only_ours = tp.parse_args(["--train_kinds", "train-ours-compile"])
    assert workers.train_plan(only_ours, "ddpm-cifar10")[2] == "train-ours-compile"
    # --mixed_precision reaches every worker of ours (after it, an ablation's own precision wins), never the reference
    calls = []

    def fake_worker(kind, preset, data, batch, args, extra=()):
        calls.append((kind, batch, list(extra)))
        return {"img_per_s": 1.0, "windows": [1.0], "peak_memory_mb": 1.0, "mixed_precision": "x",
                "first_call_seconds": 0.0, "device": "cpu", "threads": 1}

    monkeypatch.setattr(workers, "run_worker", fake_worker)
    workers.side_by_side(["train-ours", "train-ours-fp32", "train-conventional-bf16"], "train-conventional-bf16",
                    "ddpm-cifar10", Path("."), 128, gpu, 1)
    assert calls == [("train-ours", 128, ["--mixed_precision", "bf16"]),
                     ("train-ours", 128, ["--mixed_precision", "bf16", "--mixed_precision", "no"]),
                     ("train-conventional-bf16", 128, [])]
    calls.clear()  # rounds rotate the order (load changes hit every kind) and pool each kind's windows
    res = workers.side_by_side(["train-ours", "train-conventional"], "train-conventional", "cpu-tiny16", Path("."),
                               8, tp.parse_args([]), 3)
    assert [c[0] for c in calls] == ["train-ours", "train-conventional", "train-conventional", "train-ours",
                                     "train-ours", "train-conventional"]
    assert res["train-ours"]["windows"] == [1.0] * 3 and res["train-ours"]["speedup"] == 1.0
    with pytest.raises(SystemExit):
        tp.parse_args(["--train_kinds", "train-mine"])


def test_attention_kernels_quick_mode_times_every_variant_and_restores_the_constants(tmp_path):
    import adaptive.attention as attention
    import benchmarks.attention_kernels as ak

    before = (attention.UNBLOCKED_SCORE_BYTES, attention.BLOCK_SCORE_BYTES_PER_THREAD)
    assert ak.main(["--quick", "--out", str(tmp_path)]) == 0
    assert (attention.UNBLOCKED_SCORE_BYTES, attention.BLOCK_SCORE_BYTES_PER_THREAD) == before
    res = json.loads((tmp_path / "attention.json").read_text())
    assert {(r["variant"], r["mode"]) for r in res["rows"]} == {(v[0], m) for v in ak.VARIANTS
                                                                 for m in ("train", "sample")}
    assert {r["variant"] for r in res["budget_sweep"]} == {f"{mib:g} MiB" for mib in ak.BUDGETS_MIB}
    assert all(r["ms"] > 0 for r in res["rows"] + res["budget_sweep"])
    assert f"| {before[1] / 2**20:g} MiB* |" in (tmp_path / "attention.md").read_text()  # the default, marked


def test_profile_groups_backward_kernels_apart_from_forward_ones():
    from benchmarks.profile_step import group_of

    assert group_of("aten::convolution_backward") == "convolution backward"
    assert group_of("aten::mkldnn_convolution") == "convolution"
    assert group_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention backward"
    assert group_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert group_of("aten::addmm") == "linear / matmul" and group_of("aten::add_") == "elementwise"
    assert group_of("aten::native_group_norm_backward") == "group norm" and group_of("aten::zeros") == "other"


@pytest.mark.slow
def test_gpu_protocol_script_runs_end_to_end_and_resumes(tmp_path):
    """benchmarks/gpu_protocol.sh on 2 CPU processes at toy size (cpu-tiny16, a proxy feature network instead of
    clean-fid's downloads): both methods train, sample and score; rerunning it redoes nothing."""
    import subprocess

    from conftest import PRECISION_FLAGS, ROOT, write_images, write_pooled_features, zip_folder

    feat, out = write_pooled_features(tmp_path / "feat.pt"), tmp_path / "protocol"
    image_zip = zip_folder(write_images(tmp_path / "train", size=16), tmp_path / "train.zip")  # cpu-tiny16's size
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PRESET": "cpu-tiny16", "CONFIG": "accelerate_configs/cpu_2proc.yaml", "DATA": str(image_zip),
           "HOURS": "1", "STEPS": "4", "BATCH": "4", "EVAL_STEPS": "2", "EVAL_IMAGES": "8", "SAMPLE_STEPS": "10",
           "SAMPLE_BATCH": "4", "FEATURES": str(feat), "OUT": str(out),
           "TRAIN_FLAGS": " ".join(["--logger none --eval_ref_num_images 16", *PRECISION_FLAGS]),
           "EVAL_FLAGS": f"--ref_dir {image_zip}"}

    def run(**extra):
        proc = subprocess.run(["bash", "benchmarks/gpu_protocol.sh"], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    run()
    summary = (out / "summary.md").read_text().splitlines()
    assert summary[0] == "| method | steps | training hours | proxy FD clean | proxy FD legacy_tensorflow |"
    assert [row.split(" | ")[:2] for row in summary[2:]] == [["| uniform", "4"], ["| adaptive", "4"]]
    for method in ("uniform", "adaptive"):
        run_dir = out / method
        assert json.loads((run_dir / "run_info.json").read_text())["world_size"] == 2
        assert len(list((run_dir / "samples" / "images").glob("*.png"))) == 8
        sampling = json.loads((run_dir / "samples" / "sampling.json").read_text())
        assert sampling["scheduler"] == "ddpm" and sampling["num_inference_steps"] == 10
        for mode in ("clean", "legacy_tensorflow"):
            assert json.loads((run_dir / f"metrics_{mode}.json").read_text())["proxy_fd"] > 0
    weights = out / "adaptive" / "unet" / "diffusion_pytorch_model.safetensors"
    before = weights.stat().st_mtime_ns
    rerun = run(METHODS="adaptive")
    assert "nothing to train" in rerun.stdout and "sampled 0 images (8 already there)" in rerun.stdout
    assert weights.stat().st_mtime_ns == before


def test_gpu_check_training_minutes_fit_before_the_deadline_and_are_equal_per_run():
    from benchmarks.gpu_check import train_minutes

    assert train_minutes(3600, 3.0, 2, 145) == 3.0  # time to spare: MINUTES itself
    m = train_minutes(300, 3.0, 2, 145)  # the deadline shortens every run alike, to what still fits
    assert m < 3.0 and 2 * m * 60 + 145 <= 300 and 2 * (m + 0.01) * 60 + 145 > 300
    assert train_minutes(100, 3.0, 2, 145) == 0.05  # past the deadline: a token run, not a negative budget


def test_gpu_check_report_reads_every_section_and_names_what_is_missing(tmp_path):
    """Speed-ups from the measured img/s of both throughput runs; a section that failed or ran out of time is named
    in its row, never filled in."""
    import benchmarks.gpu_check as gc

    out = tmp_path / "out"
    for part, kinds in (("eager", {"train-ours": 300.0, "train-conventional": 100.0, "train-conventional-bf16": 150.0}),
                        ("compile", {"train-ours-compile": 450.0})):
        (out / "throughput" / part).mkdir(parents=True)
        rows = {k: {"img_per_s": v, "peak_memory_mb": 1000.0, "first_call_seconds": 40.0 if "compile" in k else 1.0,
                    "mixed_precision": "bf16", "device": "cuda:0", "speedup": 1.0} for k, v in kinds.items()}
        (out / "throughput" / part / "results.json").write_text(
            json.dumps({"train": {"ddpm-cifar10": {"batch": 128, **rows}}}))
    (out / "env.json").write_text(json.dumps({"settings": {"PRESET": "ddpm-cifar10", "METHODS": "uniform adaptive",
                                                           "COMPILE": "1"},
                                              "device": "NVIDIA H200", "cuda_available": True}))
    (out / "sections.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"name": "memory", "limit_s": 45, "seconds": 55, "rc": 124},
        {"name": "train-adaptive", "limit_s": 150, "seconds": 3, "rc": 1}]) + "\n")
    summary = gc.summarize(out, tmp_path / "work")
    tp = summary["throughput"]
    assert tp["train-ours"]["vs_conventional"] == pytest.approx(3.0) \
        and tp["train-ours"]["vs_conventional_bf16"] == pytest.approx(2.0)
    # compiled row against the eager run's reference
    assert tp["train-ours-compile"]["vs_conventional"] == pytest.approx(4.5)
    assert summary["methods"] == {"uniform": None, "adaptive": None} and summary["memory"] == []
    text = gc.readme(summary)
    assert "| ours (--compile) | 128 | bf16 | 450.0 | 4.50x | 3.00x | 40.0 | 1000 |" in text
    assert "Not measured: `memory`: time limit after 55 s" in text
    assert "`train-adaptive`: failed (exit 1) after 3 s" in text and "`train-uniform`: not run" in text
    assert "WARNING" not in text and "Not a GPU run" not in text
    (out / "fallback.json").write_text(json.dumps({"data_note": "64 generated images"}))
    assert "WARNING: GENERATED INPUTS - 64 generated images" in gc.readme(gc.summarize(out, tmp_path / "work"))


def gpu_check_env(tmp_path) -> dict:
    """benchmarks/gpu_check.sh's environment at toy size on the CPU, with generated stand-ins for the shared data and
    feature network (SHARED points nowhere)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "OMP_NUM_THREADS": "1",
            "SHARED": str(tmp_path / "no-shared"), "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
            "PRESET": "cpu-tiny16", "BATCH": "4", "TP_FLAGS": "--rounds 1 --warmup 1 --windows 1 --window_steps 1",
            "COMPILE": "0", "MINUTES": "0.05", "EVAL_IMAGES": "64", "SAMPLE_STEPS": "5", "REF_IMAGES": "64",
            "TOTAL_SECONDS": "1200", "TP_SECONDS": "400", "MEMORY_SECONDS": "400", "REF_SECONDS": "300",
            "TRAIN_SLACK": "300", "EVAL_SECONDS": "300", "EVAL_FLAGS": f"--cache_dir {tmp_path / 'cache'}"}


def run_gpu_check(env: dict, **extra):
    import subprocess

    from conftest import ROOT

    return subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env={**env, **extra}, capture_output=True,
                          text=True, timeout=1200)


def test_gpu_check_script_refuses_bad_settings_before_writing(tmp_path):
    """Bad settings stop benchmarks/gpu_check.sh with one line and status 2 before anything is written."""
    env = gpu_check_env(tmp_path)
    for bad, message in (({"BATCH": "0"}, "BATCH must be a positive integer"), ({"PRESET": "nope"}, "PRESET 'nope'"),
                         ({"DATA": str(tmp_path / "missing.zip")}, "missing.zip does not exist")):
        proc = run_gpu_check(env, **bad)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1
        assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


@pytest.mark.slow
def test_gpu_check_script_runs_every_section_on_a_cpu_at_toy_size(tmp_path):
    """benchmarks/gpu_check.sh as a GPU session runs it, at toy size on the CPU with generated stand-ins for the shared
    data and feature network: every section writes its results, the training runs stop on their wall-clock budget
    and both methods are evaluated; past its deadline every section is skipped and says so."""
    env, out, work = gpu_check_env(tmp_path), tmp_path / "out", tmp_path / "work"
    proc = run_gpu_check(env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "GENERATED stand-ins" in proc.stdout
    sections = [json.loads(l) for l in (out / "sections.jsonl").read_text().splitlines()]
    assert [s["name"] for s in sections] == ["throughput-eager", "memory", "eval-reference", "train-uniform",
                                             "eval-uniform", "train-adaptive", "eval-adaptive"]
    assert all(s["rc"] == 0 for s in sections) \
        and len(list((tmp_path / "cache" / "reference_stats").glob("*.npz"))) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"]["versions"]["torch"] and summary["env"]["git_commit"] and summary["fallback"]["features"]
    tp = summary["throughput"]
    assert set(tp) == {"train-ours", "train-conventional", "train-conventional-bf16"}
    assert all(r["img_per_s"] > 0 and r["batch"] == 4 for r in tp.values())
    assert tp["train-ours"]["mixed_precision"] == "bf16" and tp["train-conventional"]["mixed_precision"] == "no"
    assert tp["train-conventional"]["vs_conventional"] == 1.0 \
        and tp["train-conventional-bf16"]["mixed_precision"] == "bf16"
    assert {(m["mixed_precision"], m["gradient_checkpointing"]) for m in summary["memory"]} == \
        {("no", False), ("no", True), ("bf16", False), ("bf16", True)} \
        and all(m["batch"] == 4 for m in summary["memory"])
    for method in ("uniform", "adaptive"):
        r = summary["methods"][method]
        assert r["budget_minutes"] == 0.05 and r["train_seconds"] >= 3.0 and r["steps"] > 0  # stopped by the clock
        assert r["fd_metric"] == "proxy_fd" and r["fd"] > 0 and r["eval_images"] == 64 and r["eval_steps"] == 5
        assert json.loads((out / "train" / method / "run_info.json").read_text())["mixed_precision"] == "bf16"
    table = (out / "README.md").read_text()
    assert "WARNING: GENERATED INPUTS" in table and "Not a GPU run" in table
    assert "| ours (--compile) | - | - | not measured (COMPILE=0) |" in table
    assert "| ours (eager) | 4 | bf16 |" in table and "| conventional (--mixed_precision bf16) | 4 | bf16 |" in table
    assert "| uniform | 0.05 |" in table and "| adaptive | 0.05 |" in table and table.count("proxy FD ") >= 2
    assert (out / "gpu_check.png").stat().st_size > 1000 and (out / "nvidia-smi.txt").exists()
    assert (out / "log.txt").exists() and (out / "throughput" / "eager" / "results.json").exists()
    # past the deadline every section is skipped and named so, and the exit status says so; the same OUT and WORK
    # again: nothing of the first run stands in for what was not measured this time
    late = run_gpu_check(env, TOTAL_SECONDS="1", DATA=str(work / "generated" / "images"),
                        FEATURES=str(work / "generated" / "toy-features.pt"))
    assert late.returncode == 1 and "skipped, the deadline has passed" in late.stdout
    assert {json.loads(l)["rc"] for l in (out / "sections.jsonl").read_text().splitlines()} == {124}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["throughput"] == {} and summary["memory"] == [] and set(summary["methods"].values()) == {None}
    assert "| uniform | - | not trained | - | - | - | - | `train-uniform`: time limit after 0 s |" in \
        (out / "README.md").read_text()


@pytest.mark.slow
def test_library_equivalence_quick_mode_measures_every_pair(tmp_path):
    from conftest import run_cli

    run_cli("benchmarks/library_equivalence.py", ["--quick", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["ema"]) == {"power", "ratio"} and all(v["updates"] == 5 for v in res["ema"].values())
    assert res["forward_process"]["max_abs_difference"] < 1e-5  # float32 vs float64-built tables: rounding only
    assert (tmp_path / "library.png").stat().st_size > 1000 \
        and "| forward process" in (tmp_path / "README.md").read_text()


def test_fault_drill_counts_faults_and_writes_the_table():
    from benchmarks.drill.report import readme, summarize

    def rec(category, clean=True, lost=False, hung=False, tracebacks=0, **kw):
        return {"category": category, "case": kw.pop("case", "x"), "clean": clean, "lost": lost, "hung": hung,
                "tracebacks": tracebacks, **kw}

    records = [rec("SIGKILL + resume"), rec("SIGKILL + resume", clean=False, lost=True), rec("corrupt checkpoint"),
               rec("divergence", message="train_accelerate.py: error: training diverged: ..."),
               rec("disk full", clean=False, hung=True, tracebacks=2),
               rec("disk full", clean=False, skipped=True, case="no tmpfs")]
    s = summarize(records)
    assert s["total"] == {"tried": 5, "clean": 3, "lost": 1, "tracebacks": 2, "hangs": 1}
    assert s["categories"]["SIGKILL + resume"] == {"tried": 2, "clean": 1, "lost": 1, "tracebacks": 0, "hangs": 0}
    assert list(s["categories"]) == ["SIGKILL + resume", "corrupt checkpoint", "divergence", "disk full"]
    assert s["skipped"] == ["disk full: no tmpfs"]
    meta = {"date": "2026-12-01", "command": "python benchmarks/fault_drill.py", "commit": "abc", "torch": "2",
            "seconds": 60.0, "load_start": "1.0/1.0/1.0", "load_end": "1.0/1.0/1.0"}
    text = readme(meta, records, s)
    assert "| SIGKILL + resume | 2 | 1 | 1 | 0 | 0 |" in text and "| **total** | 5 | 3 | 1 | 2 | 1 |" in text
    assert "Skipped: disk full: no tmpfs." in text and "training diverged" in text


def test_the_drill_counts_a_rank_s_traceback_but_not_the_launcher_s_report():
    from benchmarks.drill.harness import tracebacks

    rank = "Traceback (most recent call last):\n  File x\nRuntimeError: boom\n"
    launcher = "Traceback (most recent call last):\n  File y\ntorch.distributed.elastic...ChildFailedError:\n"
    assert tracebacks(rank + launcher) == 1 and tracebacks(launcher) == 0 and tracebacks("fine") == 0


def test_grad_norms_summarises_each_phase_and_how_often_the_clip_binds(tmp_path, capsys):
    import benchmarks.grad_norms as grad_norms

    runs = tmp_path / "runs"
    runs.mkdir()
    lines = [{"step": s, "grad_norm": g, "loss_scale": 0.5, "unit_grad_norm": g / 0.5}
             for s, g in [(100, 0.5), (200, 1.5), (300, 2.0), (400, 0.4), (1200, 0.25)]]
    (runs / "adaptive_seed0.stats.jsonl").write_text(
        "\n".join(json.dumps(r) for r in lines) + '\n{"step": 500, "proxy_fd": 3.0}\n{"torn')
    assert grad_norms.main(["--runs", str(runs), "--clip", "1"]) == 0
    res = json.loads((tmp_path / "grad_norms.json").read_text())["runs"]["adaptive_seed0"]
    assert res["1-250"]["grad_norm_mean"] == pytest.approx(1.0) and res["1-250"]["share_above_clip"] == 0.5
    assert res["251-500"]["grad_norm_mean"] == pytest.approx(1.2) and res["251-500"]["grad_norm_max"] == 2.0
    assert res["501-1000"] is None and res["1001-2000"]["unit_grad_norm_last"] == pytest.approx(0.5)
    assert "| adaptive_seed0 | 1.00 (50%), s 0.500 | 1.20 (50%), s 0.500 | - |" \
        in (tmp_path / "grad_norms.md").read_text()
    assert (tmp_path / "grad_norms.png").stat().st_size > 0
    assert grad_norms.main(["--runs", str(tmp_path / "nothing")]) == 2
    assert "holds no" in capsys.readouterr().err


def test_grad_by_t_second_moment_is_the_importance_sampled_estimators_and_the_optimum_minimises_it():
    import torch
    from benchmarks.grad_by_t import second_moment

    from adaptive.timesteps.adaptive import proposal

    gen = torch.Generator().manual_seed(0)
    B, D = 6, 3
    lam = torch.rand(B, generator=gen) + 0.2
    grads = torch.randn(B, 50, D, generator=gen) * torch.linspace(0.1, 3.0, B)[:, None, None]  # per-bin samples
    G = (grads ** 2).sum(-1).mean(1)  # E ||grad L_b||^2
    p = proposal(torch.ones(B), torch.rand(B, generator=gen) + 0.1, 0.1)
    # exact second moment of g = lam_b / (B p_b) grad, b ~ p, a sample uniform within its bin
    exact = sum(float(p[b]) * float(((lam[b] / (B * p[b]) * grads[b]) ** 2).sum(-1).mean()) for b in range(B))
    assert second_moment(lam, G, p) == pytest.approx(exact, rel=1e-5)
    best = second_moment(lam, G, proposal(lam, G.sqrt(), 0.0))
    for _ in range(20):  # no proposal beats lam sqrt(G)
        other = proposal(torch.ones(B), torch.rand(B, generator=gen) + 1e-3, 0.0)
        assert second_moment(lam, G, other) >= best * (1 - 1e-6)
    assert second_moment(lam, G, torch.full((B,), 1.0 / B)) > best * 1.01


def test_only_a_run_with_every_planned_evaluation_is_kept_beside_the_table(tmp_path):
    """A run stopped early by SIGTERM exits 0 too: it is not kept (a kept run is skipped when restored)."""
    from benchmarks.bench.farm import keep_finished_run, restore_finished_run

    d, out = tmp_path / "work" / "adaptive_seed10", tmp_path / "out"
    d.mkdir(parents=True)
    (d / "provenance.json").write_text(json.dumps({"eval_steps": [4, 8]}))
    (d / "run_info.json").write_text("{}")
    evals = [{"step": s, "proxy_fd": 1.0, "train_seconds": 1.0} for s in (4, 8)]
    (d / "stats.jsonl").write_text(json.dumps(evals[0]) + "\n")
    keep_finished_run(d, out)
    assert not (out / "runs").exists()
    (d / "stats.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    keep_finished_run(d, out)
    assert len(list((out / "runs").iterdir())) == 3
    assert not restore_finished_run(d, out)  # the work folder still has its records: nothing is overwritten
    shutil.rmtree(d)
    assert restore_finished_run(d, out) and (d / "stats.jsonl").read_text().count("proxy_fd") == 2


def test_each_launch_of_a_run_records_its_host_and_first_step_and_the_table_names_mixed_hosts(tmp_path):
    """A run resumed on another host mixes their speeds in its train_seconds: segments.jsonl says which steps ran
    where (kept and restored with the run), and a table names the hosts only where they differ from the report's."""
    import benchmarks.bench.farm as farm
    from benchmarks.bench.report import host_lines

    d, out = tmp_path / "work" / "adaptive_seed10", tmp_path / "out"
    job = ("adaptive", 10, [sys.executable, "-c", "pass"], d)
    farm.run_all([job], 1, 1, log=lambda m: None)
    (d / "checkpoint-250").mkdir()
    (d / "checkpoint-500").mkdir()
    farm.run_all([job], 1, 1, log=lambda m: None)
    hosts = farm.run_hosts(d)
    assert [h["from_step"] for h in hosts] == [0, 500]
    assert hosts[0]["cpu"] == farm.machine()["cpu"] and "native_bf16" in farm.machine()

    (d / "provenance.json").write_text(json.dumps({"eval_steps": [4]}))
    (d / "run_info.json").write_text("{}")
    (d / "stats.jsonl").write_text(json.dumps({"step": 4, "proxy_fd": 1.0, "train_seconds": 1.0}) + "\n")
    farm.keep_finished_run(d, out)
    shutil.rmtree(d)
    assert farm.restore_finished_run(d, out) and farm.run_hosts(d) == hosts

    one = [{"method": "adaptive", "seed": 10, "hosts": [{"from_step": 0, "cpu": "A"}, {"from_step": 250, "cpu": "A"}]},
           {"method": "uniform", "seed": 10}]  # a run from before segments were recorded
    assert host_lines(one, "A") == []
    assert host_lines([], "A") == []
    mixed = [{**one[0], "hosts": [{"from_step": 0, "cpu": "A"}, {"from_step": 250, "cpu": "B"}]}, one[1]]
    assert host_lines(mixed, "A") == ["", "Hosts per run (launch: from step, CPU): adaptive/seed10: 0 on A, 250 on B"]
    assert host_lines(one, "B") != []  # all on one host, but not the report's


def test_long_runs_plan_and_speedups_at_several_targets(tmp_path):
    from benchmarks.bench.protocol import LONG_POINTS
    from benchmarks.bench.summary import speedups_at

    tuned = tmp_path / "t.json"
    tuned.write_text(json.dumps({"learning_rate": 2e-3, "adam_beta2": 0.99}))
    pl = make_plan(parse_args(["--long", "--tuned", str(tuned), "--seeds", "0", "1"]))
    assert pl.table == "long" and pl.methods == ["uniform-tuned", "adaptive"] and pl.budget == 6000
    assert pl.points == (500, 1000, 1500, 2000, 3000, 4000, 5000, 6000) and pl.reference == "uniform-tuned"
    # 32 px: the calibration's points and budget, so that uniform-tuned's run is the calibration run itself
    pl32 = make_plan(parse_args(["--long", "--protocol", "32", "--tuned", str(tuned), "--seeds", "0"]))
    assert pl32.preset == "cpu-tiny" and pl32.points == LONG_POINTS["32"] == tuple(range(500, 6001, 500))
    with pytest.raises(ValueError, match="--tuned"):
        make_plan(parse_args(["--long", "--seeds", "0"]))
    with pytest.raises(ValueError, match="never --claim"):
        make_plan(parse_args(["--long", "--claim", "--tuned", str(tuned), "--seeds", "10", "11", "12"]))
    pts = (2000, 4000, 6000)
    rows = [curve_row("uniform-tuned", 0, {2000: 4.0, 4000: 3.0, 6000: 2.0}, planned=pts),
            curve_row("adaptive", 0, {2000: 3.0, 4000: 2.5, 6000: 2.4}, planned=pts)]
    sp = speedups_at(aggregate(rows, 6000, pts, reference="uniform-tuned"), "uniform-tuned", pts)
    assert sp["uniform-tuned"][4000]["speedup"] == pytest.approx(1.0)
    assert sp["adaptive"][2000]["speedup"] == pytest.approx(1.0)  # 4.0 is reached at its first point: 2000 / 2000
    assert sp["adaptive"][4000]["equiv_steps_to_target"] == pytest.approx(2000)  # 3.0 reached at 2,000: 2x
    assert sp["adaptive"][4000]["speedup"] == pytest.approx(2.0)
    assert sp["adaptive"][6000]["speedup"] is None  # uniform-tuned caught up: 2.0 is never reached


def test_a_development_table_also_reports_the_steps_to_the_references_fd_at_half_the_budget():
    """PROTOCOL.md v4: beside the speed-up to the reference's final FD, the steps to its mean FD at B/2."""
    from benchmarks.bench.summary import speedups_at

    pts = (500, 1000, 1500, 2000)
    rows = [curve_row("uniform-tuned", 0, {500: 4.0, 1000: 3.0, 1500: 2.6, 2000: 2.5}, planned=pts),
            curve_row("adaptive", 0, {500: 3.5, 1000: 2.5, 1500: 2.4, 2000: 2.3}, planned=pts)]
    sp = speedups_at(aggregate(rows, 2000, pts, reference="uniform-tuned"), "uniform-tuned", (2000 // 2,))
    assert sp["uniform-tuned"][1000]["speedup"] == pytest.approx(1.0)
    assert sp["adaptive"][1000]["equiv_steps_to_target"] == pytest.approx(750)  # 3.0 between 3.5 at 500, 2.5 at 1000
    assert sp["adaptive"][1000]["speedup"] == pytest.approx(1000 / 750)
    assert "T = 1000" in long_lines(sp, "uniform-tuned")[3]


METHOD_TABLES = ROOT / "docs" / "benchmarks" / "methods"
# Committed tables that today's report re-renders byte for byte (2026-11-30 predates the current README format;
# a hand-written note on how a table was made goes beside it, as 2026-12-02-fp32-dev/NOTE.md).
RERENDERED = ("2026-12-01-ablation", "2026-12-01-dev-tuned", "2026-12-01-tuning", "2026-12-02-fp32-dev",
              "2026-12-02-long16", "2026-12-02-cal32", "2026-12-02-long32", "2026-12-06-dev16-v4")


@pytest.mark.parametrize("name", RERENDERED)
def test_committed_tables_re_render_byte_identically_from_their_results(tmp_path, name):
    src = METHOD_TABLES / name
    if not (src / "results.json").is_file() or not (src / "README.md").is_file():
        pytest.skip(f"{src} is not in this checkout")
    shutil.copyfile(src / "results.json", tmp_path / "results.json")
    render_stored(tmp_path)
    assert (tmp_path / "README.md").read_bytes() == (src / "README.md").read_bytes()
    assert (tmp_path / "fd_vs_time.png").stat().st_size > 1000


def test_an_ablation_table_lists_the_flags_its_rows_ran_with(tmp_path):
    """Rows' flags come from the table's results.json (they change when the method's defaults do); tables made before
    the freeze of issue 54 stored none and list the rows of their day."""
    src = METHOD_TABLES / "2026-12-01-ablation" / "results.json"
    if not src.is_file():
        pytest.skip(f"{src} is not in this checkout")
    results = json.loads(src.read_text())
    results["ablation_flags"] = {"abl-balance": ["--timestep_sampler", "adaptive", "--adaptive_balance", "0.5"]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    render_stored(tmp_path)
    rows_line = next(line for line in (tmp_path / "README.md").read_text().splitlines() if line.startswith("Rows ("))
    assert rows_line == ("Rows (flags beyond the default `adaptive`): `abl-balance`: `--timestep_sampler adaptive "
                         "--adaptive_balance 0.5`. What each part buys: docs/adaptive.md.")


def test_report_only_re_renders_a_table_of_other_code_and_keeps_its_results(tmp_path):
    """--report_only on a committed table (its runs measured with other code): README.md as committed, results.json
    untouched - not a table emptied of its rows."""
    import benchmarks.compare_methods as compare_methods

    src, tuned = METHOD_TABLES / "2026-12-02-long16", METHOD_TABLES / "2026-12-01-tuning" / "uniform_tuned.json"
    if not (src / "results.json").is_file() or not tuned.is_file():
        pytest.skip(f"{src} is not in this checkout")
    out = tmp_path / "table"
    shutil.copytree(src, out)
    (out / "README.md").unlink()
    before = (out / "results.json").read_bytes()
    anything = str(out / "costs.json")  # --data and --feature_extractor must exist; a re-render reads neither
    argv = ["--long", "--seeds", "0", "--methods", "uniform-tuned", "adaptive", "--tuned", str(tuned), "--report_only",
            "--out", str(out), "--work", str(tmp_path / "work"), "--data", anything, "--feature_extractor", anything]
    assert compare_methods.main(argv) == 0
    assert (out / "results.json").read_bytes() == before
    assert (out / "README.md").read_bytes() == (src / "README.md").read_bytes()


def test_committed_throughput_table_re_renders_byte_identically_from_its_results(tmp_path, monkeypatch):
    """throughput.py --report_only's README.md from the committed results.json, byte for byte (the CPU count in its
    load line is this machine's, so it is set to the committed one)."""
    import re

    from benchmarks.bench.throughput_report import write_readme

    src = ROOT / "docs" / "benchmarks" / "throughput" / "2026-11-30"
    if not (src / "results.json").is_file() or not (src / "README.md").is_file():
        pytest.skip(f"{src} is not in this checkout")
    committed = (src / "README.md").read_text()
    monkeypatch.setattr(os, "cpu_count", lambda: int(re.search(r" on (\d+) CPUs\.", committed).group(1)))
    write_readme(json.loads((src / "results.json").read_text()), tmp_path / "README.md")
    assert (tmp_path / "README.md").read_bytes() == (src / "README.md").read_bytes()


def test_a_methods_only_throughput_report_has_no_empty_tables_and_plots_the_cost_ratios(tmp_path):
    """`throughput.py --only methods` into a fresh folder: the README holds the cost table alone (no empty training or
    sampling table) and names the plot, which shows the cost ratios; with nothing measured no plot is named or
    written."""
    from benchmarks.bench.throughput_report import write_plot, write_readme

    res = {"date": "2026-12-07", "machine": "cpu", "command": "c", "git_commit": "abc", "versions": {"torch": "t"},
           "train": {}, "sample": {},
           "methods": {m: {"seconds_per_step": 0.5, "cost_ratio": r, "block_ratios": [r - 0.01, r, r + 0.02],
                           "clock": "cpu"} for m, r in (("uniform", 1.0), ("adaptive", 0.984))}}
    write_readme(res, tmp_path / "README.md")
    write_plot(res, tmp_path / "throughput.png")
    text = (tmp_path / "README.md").read_text()
    assert "## Training" not in text and "## Sampling" not in text and "\n\n\n" not in text
    assert "Plot: `throughput.png`" in text and "| adaptive | 0.5000 | 0.984 | 0.974, 0.984, 1.004 |" in text
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    empty = {**res, "methods": {}}
    write_readme(empty, tmp_path / "empty.md")
    write_plot(empty, tmp_path / "empty.png")
    assert "Plot:" not in (tmp_path / "empty.md").read_text() and not (tmp_path / "empty.png").exists()


def test_the_methods_of_a_table_are_the_registry_s_and_the_protocol_s_baselines():
    from adaptive.timesteps import METHODS as REGISTERED

    assert set(REGISTERED) <= set(METHODS) and list(METHODS)[0] == "uniform" and list(METHODS)[-1] == "adaptive"
    assert METHODS["min_snr"] == ["--loss_weighting", "min_snr"] and METHODS["uniform"] == []
    assert all(METHODS[m] == ["--timestep_sampler", m] for m in REGISTERED if m != "uniform")


def test_run_signals_tabulates_the_logged_signals_at_the_requested_steps(tmp_path, capsys):
    import benchmarks.run_signals as run_signals

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"resolution": 16}))
    p = [0.04] * 7 + [0.1, 0.2, 0.32]  # bins 7-9 hold 0.62 of p; weights 1 except bin 9 at 2
    rows = [{"step": s, "grad_norm": 0.5, "loss_scale": 0.25, "unit_grad_norm": 2.0, "p_by_t": p,
             "weight_by_t": [1.0] * 9 + [2.0], "loss_by_t": [0.1] * 9 + [h]}
            for s, h in [(250, 2 / 256), (500, 1 / 512)]]
    (run / "stats.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 500, "proxy_fd": 3}\n{"torn')
    kept = tmp_path / "u_seed0.stats.jsonl"
    kept.write_text(json.dumps({**rows[0], "weight_by_t": None}) + "\n")
    assert run_signals.main(["--run", f"a={run}", "--run", f"u={kept}@32", "--steps", "300", "600",
                             "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "signals.json").read_text())["runs"]
    a = res["a"]["at"]["300"]  # the last window at or before step 300
    assert a["step"] == 250 and a["high_loss_in_floors"] == pytest.approx(2.0)
    assert a["signal_share_high"] == pytest.approx((0.1 + 0.2 + 0.64) / (0.28 + 0.1 + 0.2 + 0.64))
    assert res["a"]["at"]["600"] is None  # the run ended at 500: not reported as if it had got there
    assert res["u"]["resolution"] == 32 and res["u"]["at"]["300"] is None
    assert res["u"]["curve"][0]["high_loss_in_floors"] == pytest.approx(2 / 256 * 1024)
    table = (tmp_path / "out" / "signals.md").read_text()
    weighted = [0.004] * 7 + [0.01, 0.02, 0.64 * 2 / 256]  # p x w x L
    assert a["loss_share_high"] == pytest.approx(sum(weighted[7:]) / sum(weighted))
    assert f"| a | 16 | 250 | 0.250 | 2.00 | 0.500 | 0.320 | 0.77 | {a['loss_share_high']:.3f} | 2.00 |" in table
    assert (tmp_path / "out" / "signals.png").stat().st_size > 0
    assert run_signals.main(["--run", f"u={kept}", "--out", str(tmp_path / "x")]) == 2
    assert "give the resolution as PATH@RESOLUTION" in capsys.readouterr().err


def test_suite_times_compares_the_tests_both_runs_hold(tmp_path, capsys):
    import benchmarks.suite_times as suite_times

    def junit(path, cases):
        path.write_text("<testsuites><testsuite>" + "".join(
            f'<testcase classname="tests.t" name="{n}" time="{t}"/>' for n, t in cases) + "</testsuite></testsuites>")
        return str(path)

    before = junit(tmp_path / "a.xml", [("test_a", 10), ("test_b", 5), ("test_gone", 1)])
    after = junit(tmp_path / "b.xml", [("test_a", 12), ("test_b", 4), ("test_new", 7)])
    assert suite_times.main([before, after]) == 0
    out = capsys.readouterr().out
    assert "in both: 2 tests, before 15 s, after 16 s" in out and "only after: 1 tests, 7 s" in out
    assert "  +2.0 s tests.t::test_a" in out
    assert suite_times.main([before, after, "--except", "test_a"]) == 0
    assert "in both (except test_a): 1 tests, before 5 s, after 4 s" in capsys.readouterr().out
    assert suite_times.main([before, str(tmp_path / "missing.xml")]) == 2


def test_error_spectrum_plots_one_line_per_run_wherever_its_checkpoints_were_kept():
    from benchmarks.error_spectrum import run_label

    assert run_label("/w/_work/cal32/uniform-tuned_seed0/checkpoint-2500") == "uniform-tuned_seed0"
    assert run_label("/work/keep/cal32-2500") == run_label("/work/keep/cal32-1500") == "cal32"
    assert run_label("/work/keep/long32-2500") == "long32" != run_label("/work/keep/cal32-2500")


def test_error_spectrum_bands_split_the_power_exactly():
    import torch
    from benchmarks.error_spectrum import BAND_NAMES, band_power, radial_band

    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    per = band_power(x, radial_band(16))
    assert per.shape == (len(BAND_NAMES),)
    assert float(per.sum()) == pytest.approx(float(x.pow(2).mean()), rel=1e-5)  # Parseval: the bands partition it
    const = torch.full((2, 3, 32, 32), 0.5)  # a flat image has all its power in the mean
    assert band_power(const, radial_band(32)).tolist() == pytest.approx([0.25] + [0.0] * (len(BAND_NAMES) - 1))
    # one cycle per image along x: all power in band "1", whatever the resolution
    for s in (16, 32):
        wave = torch.cos(2 * torch.pi * torch.arange(s) / s).expand(1, 1, s, s)
        p = band_power(wave, radial_band(s))
        assert float(p[BAND_NAMES.index("1")]) == pytest.approx(0.5, rel=1e-6) and float(p.sum()) == pytest.approx(0.5)


def test_a_tables_model_record_ignores_the_method_options_its_runs_were_given():
    """results.json's model (PROTOCOL.md v4) from `-- --adaptive_balance 0 ...`: the method's options change no model,
    and the default method would refuse them (the balance-free development table crashed in its report on that)."""
    from benchmarks.bench.provenance import model_of, without_method_options

    extra = ["--mixed_precision", "no", "--adaptive_balance", "0", "--adaptive_balance_final=0", "--norm_num_groups",
             "4"]
    assert without_method_options(extra) == ["--mixed_precision", "no", "--norm_num_groups", "4"]
    assert model_of("cpu-tiny16", extra)["norm_num_groups"] == 4


def test_the_timed_sampler_changes_no_step_and_counts_only_the_samplers_calls(tmp_path, image_folder,
                                                                             fresh_accelerate_state):
    """`sampler_overhead.py`'s wrapper: two real optimizer steps of adaptive with and without it end at bit-identical
    weights and sampler state; the time it counts is the sampler's calls (a sampler made to burn a known CPU time in
    each call is charged that time, three calls a step) and not the update it wraps."""
    import contextlib
    import dataclasses
    import time

    import torch

    from adaptive.loop import optimizer_step
    from benchmarks.bench.costs import TimedSampler, measurement_runs

    def two_steps(wrap):
        torch.manual_seed(0)
        run = measurement_runs(["adaptive"], image_folder, 1, tiny_args(image_folder, tmp_path)[6:], "cpu-tiny16",
                               tmp_path / f"run-{wrap}")["adaptive"]
        if wrap:
            run = dataclasses.replace(run, timesteps=TimedSampler(run.timesteps, time.thread_time))
        batches = run.data.batches(0)
        for step in range(2):
            optimizer_step(run, step, next(batches))
        return run

    plain, timed = two_steps(False), two_steps(True)
    for a, b in zip(plain.unet.parameters(), timed.unet.parameters()):
        assert torch.equal(a, b)
    for k, v in plain.timesteps.state_dict().items():
        assert torch.equal(torch.as_tensor(v), torch.as_tensor(timed.timesteps.state_dict()[k])), k
    assert timed.timesteps.seconds > 0

    class Burner:  # each of the three calls burns ~20 ms of CPU time; the update inside around_update is not counted
        needs = frozenset()

        def burn(self):
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.02:
                pass

        def draw(self, request):
            self.burn()
            return "drawn"

        def observe(self, t, loss):
            self.burn()

        @contextlib.contextmanager
        def around_update(self, model, accelerator, draw):
            self.burn()
            yield

    s = TimedSampler(Burner(), time.thread_time)
    assert s.draw(None) == "drawn" and s.needs == frozenset()
    with s.around_update(None, None, None):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.2:  # the update: 200 ms, outside the count
            pass
    s.observe(None, None)
    assert 0.06 <= s.seconds < 0.12


def test_sampler_overhead_quick_mode_writes_its_table_and_uniform_is_its_own_reference(tmp_path,
                                                                                       fresh_accelerate_state):
    from benchmarks import sampler_overhead

    assert sampler_overhead.main(["--quick", "--methods", "adaptive", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res["methods"]) == ["uniform", "adaptive"]
    assert res["methods"]["uniform"]["attributable_ratio"] == 1.0 and res["methods"]["uniform"]["step_ratio"] == 1.0
    a = res["methods"]["adaptive"]
    assert 0 < a["sampler_seconds"] < a["step_seconds"] and len(a["step_blocks"]) == 2
    assert "| adaptive |" in (tmp_path / "README.md").read_text() and (tmp_path / "overhead.png").stat().st_size > 1000


def test_cost_blocks_warm_every_method_once_then_alternate_whole_update_periods():
    """Both cost measurements' block runner: one warm-up block per method first, then per round one block per
    method in alternating order (against drift), each at least one whole period of the method's occasional work."""
    from types import SimpleNamespace

    from benchmarks.bench.costs import interleaved_blocks

    runs = {"uniform": SimpleNamespace(timesteps=SimpleNamespace(update_period=1)),
            "adaptive": SimpleNamespace(timesteps=SimpleNamespace(update_period=50))}
    calls = []
    out = interleaved_blocks(runs, ["uniform", "adaptive"], block_steps=20, blocks=3, warmup=4,
                             block=lambda m, n: calls.append((m, n)) or len(calls))
    assert calls == [("uniform", 4), ("adaptive", 4),
                     ("uniform", 20), ("adaptive", 50), ("adaptive", 50), ("uniform", 20),
                     ("uniform", 20), ("adaptive", 50)]
    assert out == {"uniform": [3, 6, 7], "adaptive": [4, 5, 8]}
