"""Write a file whole or not at all: the one write-then-rename of the packages (`atomic_write`).

Local paths go through os (`LOCAL`). Other URLs (gs://) go through the file system passed as `fs`,
spelled as Beam's `apache_beam.io.filesystems.FileSystems` (create, rename and delete of lists):
preprocess passes it; this module imports neither Beam nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import BinaryIO, Protocol


class FileSystem(Protocol):
    """The calls `atomic_write` makes (Beam's FileSystems has them)."""

    def create(self, path: str) -> BinaryIO: ...

    def rename(self, sources: list[str], destinations: list[str]) -> None: ...

    def delete(self, paths: list[str]) -> None: ...


class LocalFiles:
    """Local paths through os: `create` makes no directory; `rename` replaces the target in one step."""

    @staticmethod
    def create(path: str) -> BinaryIO:
        return open(path, "wb")

    @staticmethod
    def rename(sources: list[str], destinations: list[str]) -> None:
        for source, destination in zip(sources, destinations, strict=True):
            os.replace(source, destination)

    @staticmethod
    def delete(paths: list[str]) -> None:
        for path in paths:
            os.remove(path)


LOCAL = LocalFiles()


@contextlib.contextmanager
def atomic_write(path: str, temp: str | None = None, fs: FileSystem = LOCAL, sync: bool = False) -> Iterator[BinaryIO]:
    """A binary file for the new content of `path`. It is written under `temp` (default `PATH.<random
    hex>.writing`, beside `path`) and renamed to `path` when the block ends, so a reader of `path` finds
    the old file or the whole new one, never a part. When the block, the write or the rename raises, the
    temp file is removed, `path` is left as it was, and the error propagates.

    `fs`: how the files are created, renamed and removed (default `LOCAL`; Beam's FileSystems for
    gs://). `sync`: the data is on disk (os.fsync) before the rename; for local files only."""
    temp = temp or f"{path}.{uuid.uuid4().hex}.writing"
    try:
        with fs.create(temp) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        fs.rename([temp], [path])
    except BaseException:
        with contextlib.suppress(Exception):  # not created, or already gone
            fs.delete([temp])
        raise
