#!/usr/bin/env python
"""Two test-suite runs side by side, test by test, from pytest's JUnit XML (`--junitxml`).

    python benchmarks/suite_times.py BEFORE.xml AFTER.xml [--except SUBSTRING ...]

Prints the count and summed time of each run, of the tests both hold (without those whose id contains a --except
substring), of the tests only one holds, and the largest per-test differences. With pytest-xdist a test's time
depends on what runs beside it on the other worker, so compare sums, and re-time a large single difference side by
side before reading it as a slowdown (docs/benchmarks/ci/2026-12-02/README.md).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET


def load(path: str) -> dict[str, float]:
    """test id -> seconds, from a JUnit XML file."""
    return {f"{t.get('classname')}::{t.get('name')}": float(t.get("time", 0))
            for t in ET.parse(path).getroot().iter("testcase")}


def report(a: dict[str, float], b: dict[str, float], excluded: list[str]) -> list[str]:
    common = {k for k in set(a) & set(b) if not any(x in k for x in excluded)}
    only_a, only_b = set(a) - set(b), set(b) - set(a)
    diffs = sorted(((b[k] - a[k], k) for k in common), reverse=True)
    return [f"before: {len(a)} tests, {sum(a.values()):.0f} s; after: {len(b)} tests, {sum(b.values()):.0f} s",
            f"in both{' (except ' + ', '.join(excluded) + ')' if excluded else ''}: {len(common)} tests, "
            f"before {sum(a[k] for k in common):.0f} s, after {sum(b[k] for k in common):.0f} s",
            f"only before: {len(only_a)} tests, {sum(a[k] for k in only_a):.0f} s; "
            f"only after: {len(only_b)} tests, {sum(b[k] for k in only_b):.0f} s",
            "largest slowdowns:", *[f"  {d:+.1f} s {k}" for d, k in diffs[:5]],
            "largest speed-ups:", *[f"  {d:+.1f} s {k}" for d, k in diffs[-5:][::-1]]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--except", dest="excluded", nargs="*", default=[], help="leave tests whose id contains these out")
    args = p.parse_args(argv)
    try:
        a, b = load(args.before), load(args.after)
    except (OSError, ET.ParseError) as e:
        print(f"suite_times.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report(a, b, args.excluded)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
