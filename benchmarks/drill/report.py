"""The drill's table: per category, cases tried / clean (behaved as specified) / lost / tracebacks / hangs, the totals,
every case, and the one-line messages the user saw -> results.json and README.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

COLUMNS = ("tried", "clean", "lost", "tracebacks", "hangs")


def tally(records: list[dict]) -> dict:
    done = [r for r in records if not r.get("skipped")]
    return {"tried": len(done), "clean": sum(r["clean"] for r in done), "lost": sum(r["lost"] for r in done),
            "tracebacks": sum(r["tracebacks"] for r in done), "hangs": sum(r["hung"] for r in done)}


def summarize(records: list[dict]) -> dict:
    """{"categories": {name: tally}, "total": tally, "skipped": [...]} in the order the categories first ran."""
    names = list(dict.fromkeys(r["category"] for r in records))
    return {"categories": {n: tally([r for r in records if r["category"] == n]) for n in names},
            "total": tally(records), "skipped": [f"{r['category']}: {r['case']}" for r in records if r.get("skipped")]}


def readme(meta: dict, records: list[dict], s: dict) -> str:
    lines = [f"# Fault drill ({meta['date']})", "",
             f"Command: `{meta['command']}`; commit `{meta['commit']}`; torch {meta['torch']}; "
             f"{meta['seconds']:.0f} s; "
             f"load average at start {meta['load_start']}, at end {meta['load_end']} on {os.cpu_count()} CPUs. "
             "What each case checks: the docstrings of `benchmarks/drill/`; the guarantees: "
             "[docs/reliability.md](../../../reliability.md). *clean*: the case behaved as specified (its exit "
             "status, one line on stderr, nothing lost or written where it must not be); *lost*: a run's data or a "
             "user's file gone or changed; *tracebacks*: shown to the user (the launcher's own `ChildFailedError` "
             "report after a rank's one line is not counted); *hangs*: a process over its time limit.", "",
             "| category | tried | clean | lost (must be 0) | tracebacks (must be 0) | hangs (must be 0) |",
             "|---|---|---|---|---|---|"]
    for name, t in [*s["categories"].items(), ("**total**", s["total"])]:
        lines.append(f"| {name} | " + " | ".join(str(t[c]) for c in COLUMNS) + " |")
    if s["skipped"]:
        lines += ["", f"Skipped: {'; '.join(s['skipped'])}."]
    lines += ["", "| category | case | clean | lost | hung | tracebacks |", "|---|---|---|---|---|---|"]
    for r in records:
        clean = "skipped" if r.get("skipped") else "yes" if r["clean"] else "NO"
        lines.append(f"| {r['category']} | {r['case']} | {clean} | {'YES' if r['lost'] else 'no'} | "
                     f"{'YES' if r['hung'] else 'no'} | {r['tracebacks']} |")
    messages = [f"{r['category']} - {r['case']}: `{r['message']}`" for r in records if r.get("message")]
    if messages:
        lines += ["", "The one-line messages the user saw:", ""] + [f"- {m}" for m in messages]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, meta: dict, records: list[dict]) -> dict:
    s = summarize(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "summary": s, "faults": records}, indent=1) + "\n")
    (out_dir / "README.md").write_text(readme(meta, records, s))
    return s
