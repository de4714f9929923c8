#!/usr/bin/env python
"""Train a DDPM (Diffusers UNet2DModel + DDPMScheduler) with Accelerate.

    accelerate launch train_accelerate.py --preset ddpm-cifar10 --output_dir runs/x
    accelerate launch --config_file accelerate_configs/8gpu_bf16.yaml train_accelerate.py --preset ddpm-cifar10 ...

Every field of adaptive.config.TrainConfig is a flag; the preset fills the flags not given.
"""

from __future__ import annotations

import sys

from adaptive.config import ConfigError, OneLineParser, add_config_arguments, resolve_config


def parse_args(argv=None):
    parser = OneLineParser(prog="train_accelerate.py", description=__doc__.split("\n\n")[0])
    add_config_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    try:
        cfg = resolve_config(parse_args(argv))
        from adaptive.loop import train

        train(cfg)
    except ConfigError as e:
        print(f"train_accelerate.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
