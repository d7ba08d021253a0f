"""Ctrl-C or SIGTERM during `melshards preprocess`: one line, the run's staging dir removed, the lock
released, the job's processes killed, exit 130 (SIGINT) or 143 (SIGTERM: `timeout`, a scheduler,
`kill PID`).

The Beam job runs in a job process that leads a process group of its own, with its output and its
workers' in a log file (`melshards.preprocess.workers.run_in_job_process`): a signal sent to the
command's process group (a terminal's Ctrl-C, `timeout`) reaches this process alone. Its handler
raises KeyboardInterrupt in the main thread; on its way out the job's process group is killed and
waited for, and the staging dir removed (`melshards.preprocess.job.run.run_job`); the job's log is not
shown. Then one line, and the exit code (143 for SIGTERM: 128 + 15, what a shell reports for a
process SIGTERM ended). A publish under way (the finished run being moved into place, in this
process) is never cut in half: the interrupt takes effect after it, and the line says the new run
is in place.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Literal

import click

from melshards.preprocess.out_dir import staging

# The signals that stop a run -> (exit code, how its line begins).
STOPPING_SIGNALS: dict[int, tuple[int, str]] = {
    signal.SIGINT: (130, "interrupted"),
    signal.SIGTERM: (143, "terminated (SIGTERM)"),
}


def stopped_line(signum: int, out_dir: str, published: bool) -> str:
    """The one line a run stopped by `signum` ends with."""
    what = STOPPING_SIGNALS[signum][1]
    return (
        f"{what}: the new run was already in place in {out_dir}"
        if published
        else f"{what}: the run's temporary files were removed; {out_dir} is as it was"
    )


class StopOnCtrlC:
    """Context manager around a preprocess run that stops it on SIGINT (Ctrl-C) or SIGTERM (main
    thread only; elsewhere it does nothing): it ends with the signal's line and exit code
    (click.exceptions.Exit)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        # Not a signal that is ignored (SIGINT in a background job of a script): the user asked for no
        # interrupts of that kind.
        main = threading.current_thread() is threading.main_thread()
        self.signals = tuple(s for s in STOPPING_SIGNALS if main and signal.getsignal(s) is not signal.SIG_IGN)
        self.signum: int | None = None

    def __enter__(self):
        staging.STOPPING.clear()  # this run's own state: an earlier run in this process may have left its own
        staging.PUBLISHED.clear()
        self.old_handlers = {s: signal.signal(s, self._on_signal) for s in self.signals}
        return self

    def _on_signal(self, signum, frame) -> None:
        if self.signum is not None:  # a second Ctrl-C (or a SIGTERM) while the first is handled
            return
        self.signum = signum
        for s in self.signals:  # the command is ending: a second signal changes nothing
            signal.signal(s, signal.SIG_IGN)
        logging.disable(logging.CRITICAL)  # nothing but the line from here on
        staging.STOPPING.set()  # no publish begins from now on
        if not staging.PUBLISHING:  # else the publish finishes, then __exit__ ends the command
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> Literal[False]:
        try:
            if self.signum is not None:
                staging.abort_active()  # what a run staged and still holds (none after `run_job`'s own clean-up)
                click.echo(stopped_line(self.signum, self.out_dir, bool(staging.PUBLISHED)), err=True)
        finally:  # the process goes on as it was (a notebook, a script that runs the command again)
            for s, old in self.old_handlers.items():
                signal.signal(s, old)
            if self.signum is not None:
                logging.disable(logging.NOTSET)
                staging.STOPPING.clear()
        if self.signum is not None:
            raise click.exceptions.Exit(STOPPING_SIGNALS[self.signum][0])
        return False
