"""train_accelerate.py whose checkpoint writes pause between the files and the manifest (PAUSE seconds, first arg):
a wide window in which a kill leaves a half-written checkpoint. The fault is injected here, not in the product.

    python -m tests.helpers.slow_checkpoint_train 30 --output_dir ... (train_accelerate.py flags)
"""

import sys
import time

import adaptive.checkpoint as checkpoint
import train_accelerate

pause = float(sys.argv[1])
write_manifest = checkpoint.write_manifest


def slow_write_manifest(folder, step):
    time.sleep(pause)
    write_manifest(folder, step)


checkpoint.write_manifest = slow_write_manifest
sys.exit(train_accelerate.main(sys.argv[2:]))
