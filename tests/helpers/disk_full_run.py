"""A run on a small tmpfs that fills up while writing its second checkpoint (run it in a private mount namespace:
`unshare -rm python -m tests.helpers.disk_full_run ...`; the tmpfs and everything on it vanish with the namespace).

    python -m tests.helpers.disk_full_run SIZE_MB MOUNT RESULT_JSON -- train_accelerate.py flags (without --output_dir)

1. mount a SIZE_MB tmpfs at MOUNT; 2. train 1 step into MOUNT/run (checkpoint-1 and the export fit); 3. hash
checkpoint-1 and leave a stale .checkpoint-7.tmp; 4. resume to step 2: checkpoint-2 does not fit. RESULT_JSON gets
both exit codes, the second run's stderr, checkpoint-1's hashes before and after, and the folder's listing.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def hashes(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def main() -> None:
    size_mb, mount, result = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    flags = sys.argv[sys.argv.index("--") + 1:]
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)], check=True)
    run = mount / "run"
    train = [sys.executable, str(ROOT / "train_accelerate.py"), *flags, "--output_dir", str(run),
             "--checkpointing_steps", "1", "--resume_from_checkpoint", "latest"]
    first = subprocess.run([*train, "--max_train_steps", "1"], cwd=ROOT, capture_output=True, text=True)
    out = {"first_rc": first.returncode, "first_stderr": first.stderr[-3000:]}
    if first.returncode == 0:
        out["before"] = hashes(run / "checkpoint-1")
        (run / ".checkpoint-7.tmp").mkdir()
        (run / ".checkpoint-7.tmp" / "model.safetensors").write_bytes(b"partial")
        second = subprocess.run([*train, "--max_train_steps", "2"], cwd=ROOT, capture_output=True, text=True)
        out.update(second_rc=second.returncode, second_stderr=second.stderr, second_stdout=second.stdout[-3000:],
                   after=hashes(run / "checkpoint-1"), listing=sorted(p.name for p in run.iterdir()))
    result.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
