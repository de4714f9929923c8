"""train_accelerate.py whose optimizer step STEP fails: MODE raise (a RuntimeError, as an allocation failure would) or
kill (SIGKILL of the process itself). The fault is injected here, not in the product.

    python -m tests.helpers.fail_at_step raise 1 --output_dir ... (train_accelerate.py flags)
"""

import os
import signal
import sys

import adaptive.loop as loop
import train_accelerate

mode, fail_step = sys.argv[1], int(sys.argv[2])
optimizer_step = loop.optimizer_step


def failing_optimizer_step(run, step, micro_batches):
    if step + 1 == fail_step:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("injected failure: cannot allocate memory")
    return optimizer_step(run, step, micro_batches)


loop.optimizer_step = failing_optimizer_step
sys.exit(train_accelerate.main(sys.argv[3:]))
