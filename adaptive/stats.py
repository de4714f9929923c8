"""Report statistics anywhere without a host sync; aggregate over ranks once per log step (edm2's training_stats)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch


class Stats:
    """Running sums of device tensors; `flush` reduces them across ranks with one collective and one sync."""

    def __init__(self):
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, float] = {}  # host-side: element counts are known without looking at the device

    def report(self, name: str, value: torch.Tensor) -> None:
        """Add the elements of `value` (detached) to statistic `name`; mean over all elements and ranks at flush."""
        v = value.detach().float()
        if name in self._sums:
            self._sums[name] += v.sum()
            self._counts[name] += v.numel()
        else:
            self._sums[name], self._counts[name] = v.sum(), float(v.numel())

    def flush(self, accelerator) -> dict[str, float]:
        """Means over everything reported since the last flush, on all ranks (every rank must call this)."""
        names = sorted(self._sums)
        if not names:
            return {}
        sums = torch.stack([self._sums[n] for n in names])
        counts = torch.tensor([self._counts[n] for n in names], device=sums.device)
        packed = torch.cat([sums, counts])
        if accelerator.num_processes > 1:
            packed = accelerator.reduce(packed, reduction="sum")
        values = packed.tolist()  # sync point: once per log step
        self._sums.clear()
        self._counts.clear()
        k = len(names)
        return {n: (values[i] / values[k + i] if values[k + i] else math.nan) for i, n in enumerate(names)}


class JsonlWriter:
    """Appends one JSON object per line (main process only); `truncate_after(step)` drops records of a later step."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = Path(path), enabled

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")

    def truncate_after(self, step: int) -> None:
        """Keep records with record['step'] <= step (used on resume, so the file matches an uninterrupted run)."""
        if not self.enabled or not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(l + "\n" for l in keep))
        tmp.replace(self.path)


def read_jsonl(path: Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out
