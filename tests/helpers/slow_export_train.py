"""train_accelerate.py whose pipeline exports print EXPORTING and pause PAUSE seconds (first arg) before writing: a
wide window for a signal or a kill during an export. The fault is injected here, not in the product.

    python -m tests.helpers.slow_export_train 20 --output_dir ... (train_accelerate.py flags)
"""

import sys
import time

import adaptive.outputs as outputs
import train_accelerate

pause = float(sys.argv[1])
export_pipeline = outputs.export_pipeline


def slow_export_pipeline(*args, **kwargs):
    print("EXPORTING", flush=True)
    time.sleep(pause)
    export_pipeline(*args, **kwargs)


outputs.export_pipeline = slow_export_pipeline
sys.exit(train_accelerate.main(sys.argv[2:]))
