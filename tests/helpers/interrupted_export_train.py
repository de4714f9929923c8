"""train_accelerate.py whose exports after the first print EXPORTING and pause PAUSE seconds (first arg) once the
pipeline's weights are written, before the rest of the export: a window for a signal in the middle of an export. The
fault is injected here, not in the product.

    python -m tests.helpers.interrupted_export_train 20 --output_dir ... (train_accelerate.py flags)
"""

import sys
import time

from diffusers import DDPMPipeline

import train_accelerate

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
