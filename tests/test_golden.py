"""Behaviour unchanged, provably: a short cpu-tiny16 run of every timestep method, with 1 and 2 ranks, must end with
the recorded parameters, EMA, optimizer state, timestep-sampler state, logged losses and proxy FD, bit for bit
(tests/golden/golden.json, recorded before the code was rearranged).

Hashes are compared exactly on the platform they were recorded on (CPU model, torch version); elsewhere the sums of
the same tensors are compared to 1e-4 (bf16 kernels may round differently on another CPU).

Re-record (only for an intended change of behaviour, named in the commit):  python tests/test_golden.py
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, write_images, write_pooled_features

GOLDEN = Path(__file__).parent / "golden" / "golden.json"
HELPER = "tests/helpers/golden_runs.py"


def fingerprint() -> dict:
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "torch": torch.__version__, "machine": platform.machine()}


def golden_runs(tmp: Path, nproc: int) -> dict:
    data = write_images(tmp / "train")  # the same generated images as conftest's image_folder
    feats = write_pooled_features(tmp / "feat.pt")
    proc = run_cli(HELPER, [str(data), str(feats), str(tmp / f"runs{nproc}")], nproc=nproc,
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    line = next(l for l in proc.stdout.splitlines() if l.startswith("GOLDEN "))
    return json.loads(line[len("GOLDEN "):])


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_every_method_ends_bit_identical_to_the_recorded_run(tmp_path, nproc):
    golden = json.loads(GOLDEN.read_text())
    want = golden["runs"][str(nproc)]
    got = golden_runs(tmp_path, nproc)["runs"]
    assert sorted(got) == sorted(want)
    if golden["fingerprint"] == fingerprint():
        diff = {m: [k for k in ("model", "ema", "optimizer", "sampler", "logged") if got[m][k] != want[m][k]]
                for m in want}
        assert not any(diff.values()), f"{nproc} rank(s): changed {diff}"
    else:
        for m in want:
            for k, v in want[m]["sums"].items():
                assert got[m]["sums"][k] == pytest.approx(v, rel=1e-4), (m, k)


if __name__ == "__main__":  # record
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    with tempfile.TemporaryDirectory() as d:
        runs = {str(n): golden_runs(Path(d) / str(n), n)["runs"] for n in (1, 2)}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"fingerprint": fingerprint(), "runs": runs}, indent=1) + "\n")
    print(f"recorded {GOLDEN}")
