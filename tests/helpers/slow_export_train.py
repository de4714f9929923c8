"""train_accelerate.py whose pipeline exports print EXPORTING and pause PAUSE seconds (first arg) before writing: a
wide window for a signal or a kill during an export. The fault is injected here, not in the product.

    python tests/helpers/slow_export_train.py 20 --output_dir ... (train_accelerate.py flags)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import adaptive.outputs as outputs  # noqa: E402  (where the loop's exports are called)
import train_accelerate  # noqa: E402

pause = float(sys.argv[1])
export_pipeline = outputs.export_pipeline


def slow_export_pipeline(*args, **kwargs):
    print("EXPORTING", flush=True)
    time.sleep(pause)
    export_pipeline(*args, **kwargs)


outputs.export_pipeline = slow_export_pipeline
sys.exit(train_accelerate.main(sys.argv[2:]))
