"""Report statistics anywhere without a host sync; aggregate over ranks once per log step (edm2's training_stats)."""

from __future__ import annotations

import json
import math
from pathlib import Path


import torch

from .faults import writing


class Stats:
    """Running sums of device tensors; `flush` reduces them across ranks with one collective and one sync."""

    def __init__(self):
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, float] = {}  # host-side: element counts are known without looking at the device
        self._bin_sums: dict[str, torch.Tensor] = {}
        self._bin_counts: dict[str, torch.Tensor] = {}

    def report(self, name: str, value: torch.Tensor) -> None:
        """Add the elements of `value` (detached) to statistic `name`; mean over all elements and ranks at flush."""
        v = value.detach().float()
        if name in self._sums:
            self._sums[name] += v.sum()
            self._counts[name] += v.numel()
        else:
            self._sums[name], self._counts[name] = v.sum(), float(v.numel())

    def report_binned(self, name: str, bins: torch.Tensor, values: torch.Tensor, num_bins: int) -> None:
        """Per-bin means of `values` [B] grouped by `bins` [B] in 0..num_bins-1 (reported as a list at flush)."""
        v = values.detach().float()
        sums = torch.zeros(num_bins, device=v.device).index_add_(0, bins, v)
        counts = torch.zeros(num_bins, device=v.device).index_add_(0, bins, torch.ones_like(v))
        if name in self._bin_sums:
            self._bin_sums[name] += sums
            self._bin_counts[name] += counts
        else:
            self._bin_sums[name], self._bin_counts[name] = sums, counts

    def flush(self, accelerator) -> dict[str, float]:
        """Means over everything reported since the last flush, on all ranks (every rank must call this)."""
        names, binned = sorted(self._sums), sorted(self._bin_sums)
        if not names and not binned:
            return {}
        device = (self._sums[names[0]] if names else self._bin_sums[binned[0]]).device
        parts = [torch.stack([self._sums[n] for n in names]) if names else torch.zeros(0, device=device),
                 torch.tensor([self._counts[n] for n in names], device=device)]
        parts += [self._bin_sums[n] for n in binned] + [self._bin_counts[n] for n in binned]
        packed = torch.cat(parts)
        if accelerator is not None and accelerator.num_processes > 1:
            packed = accelerator.reduce(packed, reduction="sum")
        values = packed.tolist()  # sync point: once per log step
        k = len(names)
        out = {n: (values[i] / values[k + i] if values[k + i] else math.nan) for i, n in enumerate(names)}
        pos = 2 * k
        sizes = [self._bin_sums[n].numel() for n in binned]
        sums_at = pos
        counts_at = pos + sum(sizes)
        for n, size in zip(binned, sizes):
            s_, c_ = values[sums_at : sums_at + size], values[counts_at : counts_at + size]
            out[n] = [a / b if b else None for a, b in zip(s_, c_)]
            sums_at += size
            counts_at += size
        self._sums.clear()
        self._counts.clear()
        self._bin_sums.clear()
        self._bin_counts.clear()
        return out


class JsonlWriter:
    """Appends one JSON object per line (main process only); `truncate_after(step)` drops records of a later step."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = Path(path), enabled

    def write(self, record: dict) -> None:
        if self.enabled:
            with writing(self.path.name, self.path.parent, "checkpoints are unaffected"), open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")

    def truncate_after(self, step: int) -> int:
        """Keep records with record['step'] <= step (used on resume, so the file matches an uninterrupted run);
        returns how many lines were not a step's record (torn by a kill, or of another shape) and were dropped."""
        if not self.enabled or not self.path.exists():
            return 0
        keep, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
                at = record.get("step", 0) if isinstance(record, dict) else None
            except json.JSONDecodeError:
                at = None  # a line torn by a kill
            if isinstance(at, (int, float)) and not isinstance(at, bool):
                if at <= step:
                    keep.append(line)
            else:
                dropped += 1
        tmp = self.path.with_suffix(".tmp")
        with writing(self.path.name, self.path.parent):
            tmp.write_text("".join(l + "\n" for l in keep))
        tmp.replace(self.path)
        return dropped
