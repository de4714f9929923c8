"""The divergence guard: the loss and the weights checked finite, the loss's running range (session.LossRange) and
what follows from it - checkpoints marked, rotation held, and the one-line Diverged naming the checkpoint to resume.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .build import Run
from .checkpoint import checkpoint_step, list_checkpoints, mark_out_of_range, out_of_range, rotate
from .faults import Diverged
from .session import RANGE_FACTOR, Session


def watch_loss(run: Run, session: Session, values: dict, loss: float) -> None:
    """After a log step: Diverged (every rank: the values are reduced) if the loss or the gradient norm is not
    finite; when the loss just left its running range, the checkpoints it does not vouch for are marked (`latest`
    skips them) and rotation holds; else rotation as usual."""
    progress = run.progress
    # fp16: the GradScaler skips steps with non-finite gradients itself (and lowers its scale), so only the loss
    checked = ("loss",) if run.accelerator.scaler is not None else ("loss", "grad_norm")
    bad = [f"{k} = {values[k]}" for k in checked if k in values and not math.isfinite(values[k])]
    first, session.logged_step = session.logged_step + 1, progress.step
    median = session.loss_range.observe(progress.step, loss) if "loss" in values else None
    if median is not None and run.accelerator.is_main_process:  # just left: `latest` skips what it does not vouch for
        lr_ = session.loss_range
        marked = mark_out_of_range(Path(run.cfg.output_dir), lr_.vouched_step, progress.step, lr_.resumed_at)
        if marked:
            session.log(f"marked {', '.join(marked)} (taken after the last in-range log step): `latest` skips them")
    if median is not None and not bad:
        session.log(f"warning: the loss left its running range at step {progress.step} ({loss:.3g}, over "
                    f"{RANGE_FACTOR:g}x the median {median:.3g} of the previous log steps): the newest checkpoint at "
                    f"or before step {session.loss_range.vouched_step} is kept from rotation until it returns")
    else:
        rotate_checkpoints(run, session)
    if bad:
        window = f" (mean over steps {first}-{progress.step})" if first < progress.step else ""
        raise diverged(run, session, f"{' and '.join(bad)} at step {progress.step}{window}")


def rotate_checkpoints(run: Run, session: Session, exact: bool = False) -> None:
    """--checkpoints_total_limit (main process), only while the loss is in its running range: beyond the limit the
    newest checkpoint the loss vouches for is kept (session.LossRange), except at the end of a run (`exact`).
    save_checkpoint applies the same rule, with the same protection, right after each write."""
    limit = run.cfg.checkpoints_total_limit
    if limit and session.loss_range.left_at is None and run.accelerator.is_main_process:
        rotate(Path(run.cfg.output_dir), limit, None if exact else session.loss_range.protected())


def check_finite(run: Run, session: Session) -> None:
    """Before anything is written from the weights (grid, snapshot, checkpoint, export): Diverged if one is not
    finite (every rank: the weights are identical). Sync point: once per write, not per step."""
    finite = torch.stack([torch.isfinite(p).all() for p in run.unet.parameters()]).all()
    if not finite.item():
        raise diverged(run, session, f"non-finite weights after step {run.progress.step}")


def diverged(run: Run, session: Session, what: str) -> Diverged:
    """The one-line fault, naming the checkpoint to resume from: the newest, or while the loss is out of its running
    range the newest before it left it (else the newest written while it was in range: what `latest` resumes)."""
    protect = session.loss_range.protected() if session.loss_range.left_at is not None else None
    every_one = list_checkpoints(Path(run.cfg.output_dir))
    healthy = [p for p in every_one if out_of_range(p) is None]
    before = [p for p in healthy if protect is None or checkpoint_step(p) <= protect][-1:]
    which = "the newest checkpoint" if protect is None else "the newest checkpoint before the loss left its range"
    if not before and healthy:
        before, which = healthy[-1:], "the newest checkpoint written while the loss was in its range (`latest`)"
    after = " (every checkpoint was taken after the loss left its range)" if every_one else ""
    return Diverged(f"training diverged: {what}; nothing was saved from non-finite weights; "
                    + (f"resume from {before[0].name}, {which}, " if before else f"restart{after} ")
                    + "with a lower --learning_rate or gradient clipping (--max_grad_norm)")
