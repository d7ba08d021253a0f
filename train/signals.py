"""Ctrl-C and SIGTERM in the trainer: the first asks for a checkpoint and a clean stop, a second ends
the process at once, even inside a long C++ call (the first XLA compile)."""

from __future__ import annotations

import ctypes
import logging
import signal
import socket
import threading

log = logging.getLogger("melshards.train")


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits cleanly.

    A second signal ends the process at once, without a checkpoint, even while the main thread
    sits in a long C++ call (an XLA compile: docs/performance.md#compile). Python runs its signal
    handlers only on the main thread between bytecodes, so they would wait for the call to end; and
    while one signal is pending CPython does not even report the next one to `set_wakeup_fd`. So a
    watcher thread, woken through the wakeup fd by the first signal, acknowledges it at once and
    puts the C-level default action (terminate) back for both signals: the next one ends the
    process in the kernel (exit status 128 + signal number in a shell).
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        self._watcher = threading.Thread(target=self._watch, name="melshards-stop-watcher", daemon=True)
        self._watcher.start()
        return self

    def _handle(self, signum, frame):  # main thread, between bytecodes: records the request only
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    def _watch(self):
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:  # __exit__ closed the writer
                return
            stops = [signal.Signals(b) for b in data if b in (signal.SIGINT, signal.SIGTERM)]
            if stops:
                _default_action_for(signal.SIGINT, signal.SIGTERM)
                log.warning(
                    "%s received: checkpointing at the end of this step, then exiting "
                    "(send it again to stop at once, without a checkpoint)",
                    stops[0].name,
                )
                return

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():  # also replaces the C-level default action
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._writer.close()
        self._watcher.join()
        self._reader.close()


def _default_action_for(*signals: signal.Signals) -> None:
    """sigaction(SIG_DFL) from any thread: Python's signal.signal may only be called on the main one."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    for sig in signals:
        libc.signal(int(sig), None)  # None is SIG_DFL (0)
