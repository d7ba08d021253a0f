"""The trainer's errors; each message says what is wrong and what to do."""

from __future__ import annotations


class TrainError(RuntimeError):
    """Training stopped on bad data or a diverged loss; the message says where and what to do."""


class ModelDirError(ValueError):
    """The --model-dir cannot hold this run (not writable, a file in the way): a usage error."""


class RestoreError(RuntimeError):
    """A checkpoint did not restore every variable of the model."""


class CheckpointError(ModelDirError, RestoreError):
    """A checkpoint's files are missing or damaged (truncated data, no index): a usage error that names the
    checkpoint and how to go on. Also a RestoreError, for callers that catch those."""
