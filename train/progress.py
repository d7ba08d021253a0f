"""What the trainer prints while it runs: a progress bar on a terminal, log lines otherwise, and the
validation losses."""

from __future__ import annotations

import logging
import sys

from melshards.train.metrics import RunState

log = logging.getLogger("melshards.train")


class Progress:
    """A one-line progress bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, every: int):
        self.total, self.every = total, every
        self.tty = sys.stderr.isatty()

    def update(self, state: RunState) -> None:
        step, loss = state.step, state.last["loss"]
        steps_per_s, examples_per_s = state.rates["steps_per_second"], state.rates["examples_per_second"]
        if self.tty:
            width = 30
            done = int(width * step / self.total)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{self.total} "
                f"loss {loss:.4f} {steps_per_s:.2f} steps/s {examples_per_s:.1f} ex/s "
            )
            sys.stderr.flush()
        elif step % self.every == 0 or step == self.total:
            log.info(
                "step %d/%d loss %.4f %.2f steps/s %.1f examples/s", step, self.total, loss, steps_per_s, examples_per_s
            )

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def log_validation(state: RunState) -> None:
    v = state.val_losses
    parts = ", ".join(f"{k} {v[k]:.4f}" for k in v if k != "loss")
    log.info("step %d validation loss %.4f (%s)", state.step, v["loss"], parts)
