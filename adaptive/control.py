"""When to stop: preemption signals (SIGTERM, SIGUSR1, SIGHUP - a closed terminal -, first Ctrl-C) and the wall-clock
budget, agreed by all ranks.

Ranks see signals and clocks at slightly different moments, so the decision is all-reduced (MAX) on a CPU (gloo)
process group, asynchronously: the flag sent at step s is read at step s+1. Every rank therefore stops after the
same step, without a collective or host sync on the training device, and agrees on why: a signal on any rank
(preempted: checkpoint only) outranks a spent budget (finished: checkpoint and export).

The handlers are installed first thing (train_accelerate.main, before torch is imported) and stay until the run's
end: a signal during start-up stops the run after its first step (checkpoint written), one during the final export
lets the export finish; either way the exit status is 0.
"""

from __future__ import annotations

import signal
from datetime import timedelta
from typing import Optional


class StopControl:
    def __init__(self, signals=(signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)):
        """Install the signal handlers (cheap: no torch); `attach` adds the ranks and the budget once they exist."""
        self.world_size = 1
        self.budget_seconds: Optional[float] = None
        self.reason: Optional[str] = None  # why this rank wants to stop
        self.preempted = False  # the agreed kind of stop: True = a signal (on any rank), False = the budget
        self._previous = {}
        for s in signals:
            try:
                self._previous[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not in the main thread (e.g. under a test runner thread)
                pass
        self._group = self._flag = self._work = None

    def attach(self, world_size: int, budget_seconds: Optional[float] = None,
               timeout: Optional[timedelta] = None) -> "StopControl":
        """Every rank, once the process group exists: the CPU (gloo) group the decision is all-reduced on."""
        import torch
        import torch.distributed as dist

        self.world_size, self.budget_seconds = world_size, budget_seconds
        self._group = dist.new_group(backend="gloo", timeout=timeout) if world_size > 1 and dist.is_initialized() \
            else None
        self._flag = torch.zeros(1)
        return self

    def _on_signal(self, signum, frame):
        if signum == signal.SIGINT and self._signalled and self.reason.startswith("received SIGINT"):
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        if not self._signalled:
            self.reason, self._signalled = f"received {signal.Signals(signum).name}", True

    _signalled = False  # a signal arrived on this rank

    def local_flag(self, train_seconds: float) -> float:
        """0 = go on, 1 = this rank's budget is spent, 2 = this rank received a signal."""
        if self.reason is None and self.budget_seconds is not None and train_seconds >= self.budget_seconds:
            self.reason = f"--max_train_minutes budget of {self.budget_seconds / 60:g} min spent"
        return 2.0 if self._signalled else 1.0 if self.reason is not None else 0.0

    def should_stop(self, train_seconds: float) -> bool:
        """Call once per optimizer step on every rank; True on all ranks at the same step (and `preempted` agreed)."""
        local = self.local_flag(train_seconds)
        if self._group is None:
            self.preempted = local == 2.0
            return local > 0
        import torch
        import torch.distributed as dist

        decided = 0.0
        if self._work is not None:
            self._work.wait()
            decided = self._flag.item()  # CPU tensor: no device sync
        self._flag = torch.tensor([local])
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        if decided > 0:
            self.preempted = decided == 2.0
            if self.reason is None or (self.preempted and not self._signalled):
                self.reason = "another rank received a signal" if self.preempted else "another rank's budget is spent"
        return decided > 0

    def close(self) -> None:
        """Finish the outstanding all-reduce (every rank) and restore the previous signal handlers."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        self.restore_handlers()

    def restore_handlers(self) -> None:
        for s, h in self._previous.items():
            try:
                signal.signal(s, h)
            except (ValueError, TypeError):
                pass
        self._previous = {}
