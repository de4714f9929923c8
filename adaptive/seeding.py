"""Deterministic seeds from (seed, purpose, step, ...): every random draw in training is a pure function of these."""

from __future__ import annotations

import hashlib

import torch


def seed_for(*parts) -> int:
    """A 63-bit seed derived from any tuple of ints/strings (stable across processes, platforms and Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(device: torch.device | str, *parts) -> torch.Generator:
    """A torch.Generator on `device` seeded from `parts`."""
    return torch.Generator(device=device).manual_seed(seed_for(*parts))
