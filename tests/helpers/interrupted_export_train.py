"""train_accelerate.py whose exports after the first print EXPORTING and pause PAUSE seconds (first arg) once the
pipeline's weights are written, before the rest of the export: a window for a signal in the middle of an export. The
fault is injected here, not in the product.

    python tests/helpers/interrupted_export_train.py 20 --output_dir ... (train_accelerate.py flags)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diffusers import DDPMPipeline  # noqa: E402

import train_accelerate  # noqa: E402

pause, calls = float(sys.argv[1]), []
save_pretrained = DDPMPipeline.save_pretrained


def slow_save_pretrained(self, *args, **kwargs):
    save_pretrained(self, *args, **kwargs)
    calls.append(1)
    if len(calls) > 1:
        print("EXPORTING", flush=True)
        time.sleep(pause)


DDPMPipeline.save_pretrained = slow_save_pretrained
sys.exit(train_accelerate.main(sys.argv[2:]))
