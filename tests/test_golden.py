"""Behaviour unchanged, provably: a short cpu-tiny16 run of every timestep method, with 1 and 2 ranks, must end with
the recorded parameters, EMA, optimizer state, timestep-sampler state, logged losses and proxy FD, bit for bit
(tests/golden/golden.json; the first record was made before the code was rearranged).

The runs use the preset's bf16 autocast where the CPU has native bf16 (AVX512-BF16 / AMX) and fp32 elsewhere: emulated
bf16 is 10.6x slower for this model (docs/benchmarks/throughput/2026-12-01-avx2, AVX2-only AMD EPYC). golden.json holds one record per
(CPU, torch, precision). On a recorded platform (its CPUID) the hashes are compared exactly; on another CPU the sums of the same
tensors are compared to TOLERANCE against a record of the same precision, because kernels round differently there
(Intel Xeon vs AMD EPYC, bf16: proxy FD 2.4406 vs 2.4342 with 1 rank, 2.1969 vs 2.2066 with 2 ranks, i.e. 0.26% and
0.44%).

Record this platform (a new CPU at unchanged code, or every platform for an intended change of behaviour, named in
the commit; records of other platforms are kept):  python tests/test_golden.py
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from conftest import PRECISION_FLAGS, run_cli, write_images, write_pooled_features

GOLDEN = Path(__file__).parent / "golden" / "golden.json"
HELPER = "tests.helpers.golden_runs"  # run as a module in the repository root (conftest.run_cli)
TOLERANCE = 2e-2  # relative, for sums on an unrecorded CPU: ~5x the largest cross-CPU drift measured (0.44%)


def fingerprint() -> dict:
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "torch": torch.__version__, "machine": platform.machine(), **cpu_identity()}


KERNEL_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_fp16",
                "amx_int8", "amx_tile"}  # the ISA extensions oneDNN / ATen pick kernels by


def cpu_identity() -> dict:
    """CPUID family/model/stepping and the kernel-selecting ISA flags: the model name alone does not fix the rounding
    (two VMs both named "Intel(R) Xeon(R) Processor" gave different hashes, and one exceeded TOLERANCE)."""
    try:
        first_cpu = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        info = dict(line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)
    except OSError:
        return {}
    info = {k.strip(): v.strip() for k, v in info.items()}
    ident = " ".join(f"{k.split()[-1]} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info)
    return {"cpu_id": ident, "isa": " ".join(sorted(KERNEL_FLAGS & set(info.get("flags", "").split())))}


def platform_record(records: list[dict], fp: dict) -> dict | None:
    """The record of this platform: the most specific one whose fingerprint keys all match (records made before
    cpu_identity name only cpu, torch and machine, and still match the platform they were made on)."""
    fits = [r for r in records if all(fp.get(k) == v for k, v in r["fingerprint"].items())]
    return max(fits, key=lambda r: len(r["fingerprint"]), default=None)


def bit_for_bit(record: dict | None) -> bool:
    """Hashes are compared only against a record made on this CPUID: a record that names only the CPU's model name was
    made on one of the CPU kinds that share it, and they round differently (29b2e1e; CI met another one at adc6d54),
    so against it, and without a record, the run's sums are compared within TOLERANCE."""
    return record is not None and "cpu_id" in record["fingerprint"]


def precision() -> str:
    """The preset's bf16 where this CPU computes it natively, fp32 ("no") where bf16 would be emulated."""
    return PRECISION_FLAGS[1] if PRECISION_FLAGS else "bf16"


def golden_runs(tmp: Path, nproc: int) -> dict:
    data = write_images(tmp / "train")  # the same generated images as conftest's image_folder
    feats = write_pooled_features(tmp / "feat.pt")
    proc = run_cli(HELPER, [str(data), str(feats), str(tmp / f"runs{nproc}"), precision()], nproc=nproc,
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    line = next(l for l in proc.stdout.splitlines() if l.startswith("GOLDEN "))
    return json.loads(line[len("GOLDEN "):])


def compare(got: dict, want: dict, exact: bool, nproc: int) -> None:
    """AssertionError naming what differs between this machine's runs and the record (a method without a record:
    the command that records it)."""
    unrecorded = sorted(set(got) - set(want))
    assert not unrecorded, (f"no golden record of {', '.join(unrecorded)} for this CPU ({fingerprint()['cpu']}, "
                            f"{precision()}): record it with `python tests/test_golden.py` (docs/architecture.md)")
    assert sorted(got) == sorted(want), f"recorded methods missing from the registry: {sorted(set(want) - set(got))}"
    if exact:
        diff = {m: [k for k in ("model", "ema", "optimizer", "sampler", "logged") if got[m][k] != want[m][k]]
                for m in want}
        assert not any(diff.values()), f"{nproc} rank(s): changed {diff}"
    else:
        for m in want:
            for k, v in want[m]["sums"].items():
                assert got[m]["sums"][k] == pytest.approx(v, rel=TOLERANCE), (m, k)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_every_method_ends_bit_identical_to_the_recorded_run(tmp_path, nproc):
    records = [r for r in json.loads(GOLDEN.read_text())["records"] if r["mixed_precision"] == precision()]
    assert records, f"no golden record at mixed_precision={precision()}: record one (python tests/test_golden.py)"
    mine = platform_record(records, fingerprint())
    want = (mine or records[0])["runs"][str(nproc)]
    compare(golden_runs(tmp_path, nproc)["runs"], want, bit_for_bit(mine), nproc)


def test_a_method_without_a_record_fails_naming_the_record_command():
    """A newly registered method (here faked) is a clear failure that says how to record it."""
    from helpers.golden_runs import METHODS

    from adaptive.timesteps import METHODS as REGISTERED

    assert set(REGISTERED) <= set(METHODS)  # the golden runs come from the registry
    record = json.loads(GOLDEN.read_text())["records"][0]["runs"]["1"]
    with pytest.raises(AssertionError, match=r"no golden record of my_method .*python tests/test_golden.py"):
        compare({**record, "my_method": record["uniform"]}, record, True, 1)
    compare(record, record, True, 1)


def test_a_golden_record_is_chosen_by_platform_and_precision():
    """Every record names its platform and precision, no two share both, and both precisions are recorded."""
    records = json.loads(GOLDEN.read_text())["records"]
    keys = [(json.dumps(r["fingerprint"], sort_keys=True), r["mixed_precision"]) for r in records]
    assert len(set(keys)) == len(keys) and {r["mixed_precision"] for r in records} == {"bf16", "no"}
    assert all(sorted(r["runs"]) == ["1", "2"] for r in records)


def test_the_most_specific_matching_record_is_this_platforms():
    """A record with CPUID and ISA wins over an older one that names only the CPU's model name; a record of another
    CPUID never matches, whatever its name."""
    base = {"cpu": "Intel(R) Xeon(R) Processor", "torch": "2.14.1", "machine": "x86_64"}
    old = {"fingerprint": base}
    here = {"fingerprint": {**base, "cpu_id": "family 6 model 167 stepping 1", "isa": "amx_bf16 avx512_bf16"}}
    other = {"fingerprint": {**base, "cpu_id": "family 6 model 143 stepping 8", "isa": "amx_bf16 avx512_bf16"}}
    assert platform_record([old, here, other], here["fingerprint"]) is here
    assert platform_record([old, other], here["fingerprint"]) is old
    assert platform_record([other], here["fingerprint"]) is None
    assert bit_for_bit(here) and not bit_for_bit(old) and not bit_for_bit(None)
    assert set(cpu_identity()) <= {"cpu_id", "isa"}


if __name__ == "__main__":  # record this platform at its precision, keeping the other platforms' records
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        runs = {str(n): golden_runs(Path(d) / str(n), n)["runs"] for n in (1, 2)}
    old = json.loads(GOLDEN.read_text())["records"] if GOLDEN.exists() else []
    mine = {"fingerprint": fingerprint(), "mixed_precision": precision()}
    kept = [r for r in old if {k: r[k] for k in mine} != mine]
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"records": [*kept, {**mine, "runs": runs}]}, indent=1) + "\n")
    print(f"recorded {GOLDEN} for {mine}")
