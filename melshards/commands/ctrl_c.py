"""Ctrl-C or SIGTERM during `melshards preprocess`: one line, the run's staging dir removed, the lock
released, the workers killed, exit 130 (SIGINT) or 143 (SIGTERM: `timeout`, a scheduler, `kill PID`).

Without this, SIGINT reaches the launcher and every local worker process (one process group): each
prints its traceback, Beam logs the broken channels, and the run's temp files stay (254 lines and
three tracebacks, measured). The workers cannot be kept from the signal: Beam starts them through
`/bin/sh`, and dash clears an inherited signal mask. So, for the length of the run, this process's
stdout and stderr (and so the workers', which inherit them) go through a pipe relayed to the
console. The relay goes mute the moment SIGINT arrives: Python runs a signal handler only in the
main thread, once it next runs Python code, while a worker's dying traceback can already reach the
console through a launcher thread (Beam logs its workers' last words). So the relay watches the
signal wakeup fd, which CPython writes as the signal arrives (as `train.signals` does for the
trainer). Then the handler mutes logging, kills the worker processes and raises KeyboardInterrupt
in the main thread, which removes the staging dir on its way out
(`melshards.preprocess.run.run_job`); then one line, exit 130. SIGTERM is handled the same way (the
relay mutes on it too; `timeout` sends it to the command and then to its whole process group): its
line says so, and the exit code is 143 (128 + 15, what a shell reports for a process SIGTERM ended).
A publish under way (the finished run being moved into place) is never cut in half: the interrupt
takes effect after it, and the line says the new run is in place.

A worker that dies on its own (a crash, the out-of-memory killer) says so in many lines too (the
shell's "Killed", Beam's broken channels), a few milliseconds before the launcher learns of it
(`melshards.preprocess.workers.run_watching_workers`). So the relay writes each chunk half a second
late and goes mute once a worker is found dead: the run's one line is the error that follows. It goes
mute the same way when the job fails with an error the command tells in one line (a full disk): each
worker prints its failed bundle's traceback to the stderr it inherited a moment before.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal

from melshards.preprocess import output, workers


class _Relay(threading.Thread):
    """Copies what is written to some of this process's fds (and, inherited, the worker processes')
    to where the first of them pointed before, HOLD seconds late (a traceback TRACEBACK_HOLD, what
    follows it behind it), until muted: the workers' dying words never reach the console. fds that point to one file (`2>&1`) share one pipe, so their
    lines keep their order. A console that goes away (`| head`, EPIPE) mutes it; it keeps draining
    the pipe, so no writer ever blocks on a full pipe."""

    # What a worker's death writes (the shell's "Killed", Beam's broken-channel tracebacks) comes
    # within milliseconds of it, before the launcher learns of it: held this long, it is dropped.
    HOLD = 0.5
    # A traceback (and what follows it) is held longer: a worker prints its failed bundle's traceback
    # a second or more before the launcher learns that the job failed (1.3 s measured on 2 busy
    # cores), and a failure the command tells in one line (a full disk) mutes the relay only then.
    TRACEBACK_HOLD = 10.0
    TRACEBACK = b"Traceback (most recent call last):"

    def __init__(
        self,
        fds: tuple[int, ...],
        wakeup: socket.socket | None = None,
        mute_when: Callable[[], bool] = lambda: False,
        signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    ):
        """`wakeup`: the reading end of the signal wakeup fd; once it holds one of `signals`, nothing
        more is copied. Nor once `mute_when()` is true."""
        super().__init__(name=f"melshards-relay-{'-'.join(map(str, fds))}", daemon=True)
        self.fds, self.muted, self.wakeup, self.mute_when = fds, False, wakeup, mute_when
        self.signals = bytes(signals)
        self.original = os.dup(fds[0])
        self.saved = {fd: os.dup(fd) for fd in fds}
        read, write = os.pipe()
        for fd in fds:
            os.dup2(write, fd)
        os.close(write)
        self.read = read
        self.start()

    def _interrupted(self) -> bool:
        """A stopping signal arrived (its number is in the wakeup socket). Peeked, not read: every relay
        sees it."""
        if self.wakeup is None:
            return False
        try:
            arrived = self.wakeup.recv(4096, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        return any(n in self.signals for n in arrived)

    def run(self) -> None:
        held: collections.deque[tuple[float, bytes]] = collections.deque()  # (when it is due, chunk), in order
        open_ = True
        while open_ or held:
            if open_:
                wait = None if not held else max(0.0, held[0][0] - time.monotonic())
                if select.select([self.read], [], [], wait)[0]:
                    chunk = os.read(self.read, 65536)
                    if chunk:
                        now, at = time.monotonic(), chunk.find(self.TRACEBACK)
                        if at != 0:
                            held.append((now + self.HOLD, chunk if at < 0 else chunk[:at]))
                        if at >= 0:
                            held.append((now + self.TRACEBACK_HOLD, chunk[at:]))
                    else:
                        open_ = False  # every write end closed (restore): what is held goes now
            self.muted = self.muted or self._interrupted() or self.mute_when()
            now = time.monotonic()
            while held and (not open_ or held[0][0] <= now):
                chunk = held.popleft()[1]
                while chunk and not self.muted:
                    try:
                        chunk = chunk[os.write(self.original, chunk) :]
                    except OSError:
                        self.muted = True
        os.close(self.read)

    def write_through(self, text: str) -> None:
        """Straight to the console, past the pipe (the interrupt's one line)."""
        try:
            os.write(self.original, text.encode())
        except OSError:
            pass

    def restore(self) -> None:
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)  # closes a write end of the pipe; with the last, the relay reads to the end
            os.close(saved)
        self.join(timeout=30)  # a process still holding the pipe (none should) cannot hang us
        os.close(self.original)


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


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
    thread only; elsewhere it does nothing)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        # Not a signal that is ignored (SIGINT in a background job of a script): the user asked for no
        # interrupts of that kind.
        main = threading.current_thread() is threading.main_thread()
        self.signals = tuple(s for s in STOPPING_SIGNALS if main and signal.getsignal(s) is not signal.SIG_IGN)
        self.active = bool(self.signals)
        self.interrupted = False
        self.signum = 0  # the signal that stopped the run (set with interrupted); 0: none

    def __enter__(self):
        if self.active:
            _flush()
            self.old_handlers = {s: signal.signal(s, self._on_signal) for s in self.signals}
            self.wakeup, self.wakeup_writer = socket.socketpair()
            self.wakeup_writer.setblocking(False)
            self.old_wakeup = signal.set_wakeup_fd(self.wakeup_writer.fileno(), warn_on_full_buffer=False)
            w, s = self.wakeup, self.signals
            # a dead worker's last words, and the workers' tracebacks of a failure the command tells in
            # one line (a full disk), are not for the console
            workers.QUIET.clear()  # set by an earlier run of this process
            quiet = workers.QUIET.is_set
            self.relays = (
                [_Relay((1, 2), w, quiet, s)]
                if _same_file(1, 2)
                else [_Relay((1,), w, quiet, s), _Relay((2,), w, quiet, s)]
            )
        return self

    def _on_signal(self, signum, frame) -> None:
        if self.interrupted:  # a second Ctrl-C (or a SIGTERM) while the first is handled
            return
        self.interrupted = True
        self.signum = signum
        for relay in self.relays:
            relay.muted = True
        logging.disable(logging.CRITICAL)
        output.STOPPING.set()  # no publish begins from now on
        workers.kill_and_wait(workers.descendants(os.getpid()))  # none left running when the command exits
        if not output.PUBLISHING:  # else the publish finishes, then __exit__ ends the process
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> Literal[False]:
        if not self.active:
            return False
        if self.interrupted:  # remove what the run staged, one line, exit 130 (SIGINT) or 143 (SIGTERM)
            output.abort_active()
            line = stopped_line(self.signum, self.out_dir, bool(output.PUBLISHED))
            self.relays[-1].write_through(line + "\n")
            os._exit(STOPPING_SIGNALS[self.signum][0])
        if workers.QUIET.is_set():  # the runner's threads may still log their broken channels to a dead or
            logging.disable(
                logging.CRITICAL
            )  # killed worker, now straight to the console; the command ends with its line
        for s, old in self.old_handlers.items():
            signal.signal(s, old)
        signal.set_wakeup_fd(self.old_wakeup)
        _flush()
        for relay in self.relays:
            relay.restore()
        self.wakeup_writer.close()
        self.wakeup.close()
        return False


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
