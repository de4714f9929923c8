"""Whether two training runs logged the same numbers: compares two stats.jsonl files record by record (training and
evaluation records matched by step), every value exactly, the wall-clock keys aside. This is how a restarted or
resumed benchmark run is checked against the run it replaces (docs/benchmarks/README.md, "Runs that outlive their
machine").

The means over a log window (loss, grad_norm, loss_by_t) restart with the process: the first record after a resume
averages only the steps since the checkpoint, so it differs from an uninterrupted run's while the training itself is
identical. Such a record is reported, not failed, when the next training record both files hold is equal again; two
differing records in a row mean the runs diverged.

    python benchmarks/same_run.py OLD/stats.jsonl NEW/stats.jsonl

Exit 0 and one line when every record both files hold is equal; exit 1 and the first difference otherwise; exit 2 on
a file that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TIMING_KEYS = ("img_per_s", "train_seconds", "eval_seconds")  # wall-clock: differ between any two runs
WINDOW_KEYS = ("loss", "grad_norm", "loss_by_t")  # Stats means over the log window (adaptive/loop.py)


def records(path: Path) -> dict[tuple[int, bool], dict]:
    """(step, is evaluation) -> record, wall-clock keys removed; a later record of the same key (a resumed run
    re-logging a step) replaces the earlier one."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[(r["step"], "proxy_fd" in r or "fid" in r)] = {k: v for k, v in r.items() if k not in TIMING_KEYS}
    return out


def differing_keys(ra: dict, rb: dict) -> list[str]:
    return [k for k in sorted(ra.keys() | rb.keys()) if ra.get(k) != rb.get(k)]


def compare(a: dict, b: dict) -> tuple[str | None, list[int]]:
    """(the first real difference as one line, or None; the steps whose only differences are window means followed
    by an equal training record - a resume inside that log window)."""
    common = sorted(a.keys() & b.keys())
    training = [key for key in common if not key[1]]
    resumed = []
    for key in common:
        diff = differing_keys(a[key], b[key])
        if not diff:
            continue
        nxt = next((k for k in training if k[0] > key[0]), None)
        if not key[1] and set(diff) <= set(WINDOW_KEYS) and nxt and not differing_keys(a[nxt], b[nxt]):
            resumed.append(key[0])
            continue
        kind = "evaluation" if key[1] else "training record"
        k = diff[0]
        return f"{kind} at step {key[0]}: {k} = {a[key].get(k)!r} vs {b[key].get(k)!r}", resumed
    return None, resumed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    args = p.parse_args(argv)
    try:
        a, b = records(args.old), records(args.new)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"same_run: error: cannot read the stats: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    common = a.keys() & b.keys()
    if not common:
        print("same_run: no step in common", file=sys.stderr)
        return 1
    diff, resumed = compare(a, b)
    if diff:
        print(f"same_run: differ: {diff}")
        return 1
    last = max(step for step, _ in common)
    evals = sum(1 for _, is_eval in common if is_eval)
    window = (f"; window means differ at step {', '.join(map(str, resumed))} only (a resume inside that log window)"
              if resumed else "")
    print(f"same_run: identical: {len(common)} records in common ({evals} evaluations) up to step {last}, "
          f"{', '.join(TIMING_KEYS)} aside{window}; only in old: {len(a.keys() - b.keys())}, only in new: "
          f"{len(b.keys() - a.keys())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
