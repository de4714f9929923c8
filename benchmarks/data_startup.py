#!/usr/bin/env python
"""What a training start spends on its data, before and after the decoded cache (issue 56): decoding every image of
a source (no cache), the first start with the cache (decode + write) and a second start (load), at each resolution.

    python benchmarks/data_startup.py --data ../shared/datasets/cifar10-jpeg/train.zip --out docs/benchmarks/data/<date>

Writes results.json, README.md (a table) and startup.png into --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from adaptive.data import decode_or_load
from adaptive.image_files import path_entries


def path_entries_for(p: Path):
    return path_entries(p, "--data")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a folder or .zip of images (e.g. CIFAR-10's train.zip)")
    p.add_argument("--resolutions", type=int, nargs="+", default=[32, 16])
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    for resolution in args.resolutions:
        cache = Path(tempfile.mkdtemp(prefix="decoded-cache-"))
        try:
            entries = path_entries_for(args.data)
            plain, (images, _) = timed(lambda: decode_or_load(entries, resolution))
            first, (_, hit1) = timed(lambda: decode_or_load(path_entries_for(args.data), resolution, cache_dir=cache))
            second, (again, hit2) = timed(lambda: decode_or_load(path_entries_for(args.data), resolution,
                                                                 cache_dir=cache))
            assert not hit1 and hit2 and bool((again == images).all())
            size = sum(p.stat().st_size for p in cache.rglob("*.npy"))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rows.append({"resolution": resolution, "images": len(images), "decode_s": round(plain, 2),
                     "first_start_with_cache_s": round(first, 2), "second_start_s": round(second, 2),
                     "cache_bytes": size})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"date": dt.date.today().isoformat(), "data": str(args.data), "cpus": os.cpu_count(),
            "load_average": "/".join(f"{x:.1f}" for x in os.getloadavg()), "rows": rows,
            "command": "python benchmarks/data_startup.py " + " ".join(argv or [])}
    write(meta, args.out)
    return 0


def write(meta: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(meta, indent=1))
    lines = [f"# Data start-up: decoding vs the decoded cache ({meta['date']})", "",
             f"Command: `{meta['command']}`; {meta['cpus']} CPUs, load average {meta['load_average']} at the end. "
             "Seconds to have the source's images as the uint8 array training uses.", "",
             "| resolution | images | decode (no cache) | first start with the cache (decode + write) | second start "
             "(load) | cache size |", "|---|---|---|---|---|---|"]
    for r in meta["rows"]:
        lines.append(f"| {r['resolution']} px | {r['images']:,} | {r['decode_s']:.2f} s | "
                     f"{r['first_start_with_cache_s']:.2f} s | {r['second_start_s']:.2f} s | "
                     f"{r['cache_bytes'] / 2**20:.0f} MiB |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3), dpi=110)
    labels = [f"{r['resolution']} px" for r in meta["rows"]]
    xs = range(len(labels))
    for k, (key, name) in enumerate((("decode_s", "decode"), ("first_start_with_cache_s", "first start"),
                                     ("second_start_s", "second start"))):
        ax.bar([x + 0.27 * (k - 1) for x in xs], [r[key] for r in meta["rows"]], width=0.27, label=name)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "startup.png")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
