#!/usr/bin/env python
"""What a training start spends on its data, before and after the decoded cache (issue 56): decoding every image of
a source (no cache), the first start with the cache (decode + write) and a second start (load), at each resolution;
and the alternative the issue names, `datasets`' `imagefolder` with its Arrow cache (first load builds it, a second
load reads it; either way the images still have to be decoded to the uint8 array training uses).

    python benchmarks/data_startup.py --data ../shared/datasets/cifar10-jpeg/train.zip --out docs/benchmarks/data/<date>

Writes results.json, README.md (a table) and startup.png into --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from adaptive.data import decode_or_load
from adaptive.sources import HubEntries
from adaptive.image_files import path_entries
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's


def path_entries_for(p: Path):
    return path_entries(p, "--data")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a folder or .zip of images (e.g. CIFAR-10's train.zip)")
    p.add_argument("--resolutions", type=int, nargs="+", default=[32, 16])
    p.add_argument("--datasets_images", type=int, default=2000,
                   help="images decoded through datasets' imagefolder (its per-image access is slow on a zip)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def datasets_start(data: Path, resolution: int, hf_cache: Path, limit: int):
    """`datasets.load_dataset("imagefolder")` of the source (its Arrow cache in `hf_cache`), then the same decode to
    uint8 the project does for a Hub dataset (HubEntries), of the first `limit` images."""
    import datasets

    datasets.disable_progress_bars()
    kind = {"data_files": str(data)} if data.is_file() else {"data_dir": str(data)}
    ds = datasets.load_dataset("imagefolder", **kind, split="train", cache_dir=str(hf_cache), drop_labels=True)
    return decode_or_load(HubEntries(ds, "image", f"imagefolder {data.name}"), resolution, limit=limit)[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    argv = sys.argv[1:] if argv is None else argv
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
            n_ds = min(args.datasets_images, len(images))
            ds_first, _ = timed(lambda: datasets_start(args.data, resolution, cache / "hf", n_ds))
            ds_second, from_ds = timed(lambda: datasets_start(args.data, resolution, cache / "hf", n_ds))
            assert from_ds.shape[1:] == images.shape[1:] and len(from_ds) == n_ds
            ds_size = sum(p.stat().st_size for p in (cache / "hf").rglob("*.arrow"))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rows.append({"resolution": resolution, "images": len(images), "decode_s": round(plain, 2),
                     "first_start_with_cache_s": round(first, 2), "second_start_s": round(second, 2),
                     "cache_bytes": size, "datasets_first_s": round(ds_first, 2),
                     "datasets_second_s": round(ds_second, 2), "datasets_cache_bytes": ds_size,
                     "datasets_images": n_ds})
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
             "(load) | cache size | `datasets` imagefolder, first N images: first load + decode | second load + "
             "decode | N | second, scaled to 50,000 (linear) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in meta["rows"]:
        ds = (f"{r['datasets_first_s']:.2f} s | {r['datasets_second_s']:.2f} s | {r['datasets_images']:,} | "
              f"{r['datasets_second_s'] * 50000 / r['datasets_images']:.0f} s" if "datasets_first_s" in r
              else "- | - | - | -")
        lines.append(f"| {r['resolution']} px | {r['images']:,} | {r['decode_s']:.2f} s | "
                     f"{r['first_start_with_cache_s']:.2f} s | {r['second_start_s']:.2f} s | "
                     f"{r['cache_bytes'] / 2**20:.0f} MiB | {ds} |")
    lines += ["", "The decoded cache is what training and the evaluation references use: a second start loads the "
              "array. `datasets`' imagefolder cache keeps the images encoded (for a zip, references into it), so "
              "every start decodes them again, one row access at a time (each reading its image out of the zip): it is "
              "measured on the first N images, and the last column scales that time linearly to 50,000 (not "
              "measured at that size; the time includes load_dataset's fixed cost of listing the zip)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3), dpi=110)
    labels = [f"{r['resolution']} px" for r in meta["rows"]]
    xs = range(len(labels))
    series = (("decode_s", "decode"), ("first_start_with_cache_s", "first start"), ("second_start_s", "second start"),
              ("datasets_per_50k_s", "datasets: second start (scaled to 50,000)"))
    for r in meta["rows"]:
        if "datasets_second_s" in r:
            r["datasets_per_50k_s"] = r["datasets_second_s"] * 50000 / r["datasets_images"]
    for k, (key, name) in enumerate(series):
        ax.bar([x + 0.2 * (k - 1.5) for x in xs], [r.get(key, 0) for r in meta["rows"]], width=0.2, label=name)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "startup.png")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
