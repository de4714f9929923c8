#!/usr/bin/env python
"""Train a DDPM (Diffusers UNet2DModel + DDPMScheduler) with Accelerate.

    accelerate launch train_accelerate.py --preset ddpm-cifar10 --output_dir runs/x
    accelerate launch train_accelerate.py --output_dir runs/x --resume_from_checkpoint latest   # continue, same config
    accelerate launch --config_file accelerate_configs/8gpu_bf16.yaml train_accelerate.py --preset ddpm-cifar10 ...

Every field of adaptive.config.TrainConfig is a flag; the preset fills the flags not given. Resuming takes the run's
saved config.json (flags given override it; model/objective changes are refused); --config FILE starts from a saved
config; --print_config prints the resolved config and exits.
Exit status: 0 done (or stopped by a signal / the budget, checkpoint written); 2 bad input (one line on stderr); 3
trained and saved locally, but the final --push_to_hub upload did not reach the Hub (the printed command retries it);
4 training diverged, 5 disk full, 6 lost a peer rank, 7 a launch that formed no process group (adaptive/faults.py);
130 a second Ctrl-C (stopped at once, the newest checkpoint and the previous export intact); 128 + N a signal N while
waiting for the Hub's answer to --dataset_name (adaptive/hub_wait.py; nothing written).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from adaptive.config import ConfigError, parse_train_args, precision_override, read_config, resolve_config
from adaptive.control import StopControl
from adaptive.faults import lost_peer, out_of_memory, run_cli


def parse_args(argv=None):
    return parse_train_args(argv, description=__doc__.split("\n\n")[0])


def saved_config(args) -> dict:
    """--config FILE, else when resuming the run's config.json (the checkpoint's, for a checkpoint path), else {}. An
    unreadable run config.json falls back to its newest checkpoint's, saying so (every checkpoint holds the config)."""
    if args.config:
        return read_config(Path(args.config).expanduser())
    if not (isinstance(args.resume_from_checkpoint, str)
            and args.resume_from_checkpoint.lower() not in ("none", "null")):
        return {}
    ckpt = Path(args.resume_from_checkpoint).expanduser()
    if ckpt.is_dir():
        return read_config(ckpt / "config.json") if (ckpt / "config.json").is_file() else {}
    path = Path(args.output_dir or "runs/ddpm") / "config.json"
    fallback = newest_checkpoint_config(path.parent)
    if not path.is_file():  # the run's own config.json deleted: its newest checkpoint's (none: a new run)
        return read_config(fallback) if fallback else {}
    try:
        return read_config(path)
    except ConfigError as e:
        if fallback is None:
            raise
        print(f"train_accelerate.py: warning: {e}; resuming with {fallback.parent.name}'s config.json instead",
              file=sys.stderr)
        return read_config(fallback)


def newest_checkpoint_config(out: Path):
    """config.json of the newest checkpoint-<step> folder in `out` that has one, or None."""
    steps = [(int(p.name[len("checkpoint-"):]), p) for p in out.glob("checkpoint-*")
             if p.name[len("checkpoint-"):].isdigit()]
    return next((p / "config.json" for _, p in sorted(steps, reverse=True) if (p / "config.json").is_file()), None)


def main(argv=None) -> int:
    control = StopControl()  # first, before torch is imported: SIGTERM during start-up or export stops cleanly
    try:
        return run_cli("train_accelerate.py", lambda: _train(argv, control))
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once (an export being written is dropped, not half-done)
        print("train_accelerate.py: error: interrupted by a second Ctrl-C: stopped at once; the newest checkpoint and "
              "the previous export are intact; rerun with --resume_from_checkpoint latest", file=sys.stderr)
        return 130
    except Exception as e:
        # this rank's own view of a peer that ended or hung, or an allocation that failed (not a bug: no traceback)
        fault = lost_peer(e) or out_of_memory(e)
        if fault is None:
            raise
        print(f"train_accelerate.py: error: {fault}", file=sys.stderr)
        return fault.exit_code
    finally:
        control.restore_handlers()


def _train(argv, control: StopControl) -> int:
    args = parse_args(argv)
    saved = saved_config(args)
    cfg = resolve_config(args, saved=saved)
    if args.print_config:
        print(cfg.to_json())
        return 0
    from adaptive.hub import EXIT_UPLOAD_FAILED  # imports torch: after the signal handlers; --help stays fast
    from adaptive.loop import train  # imports torch: after the signal handlers; --help stays fast
    from adaptive.session import main_process_logger  # imports torch: after the signal handlers; --help stays fast

    note = precision_override(cfg, args.mixed_precision, saved, os.environ.get("ACCELERATE_MIXED_PRECISION"))
    if note:
        main_process_logger()(note)

    summary = train(cfg, control)
    return EXIT_UPLOAD_FAILED if summary.get("hub") == "not uploaded" else 0  # trained and saved; not on the Hub


if __name__ == "__main__":
    sys.exit(main())
