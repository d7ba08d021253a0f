"""What a command may write over: only a file it can prove it made for that purpose.

The rule every `melshards` command that writes follows: a path that already exists is written over
only when it carries the mark the command writes into such a file; otherwise the command refuses
with `NotOurs` (one line naming the path and what to do; the commands exit 2) before it has written
or removed anything. The marks:

| written by | the file | its mark |
|---|---|---|
| `stats --html` | an HTML report | `<meta name="generator" content="melshards stats">` in its head (`HTML`) |
| `synthesize -o` | a WAV | the RIFF `LIST/INFO` chunk's `ISFT` (software) starting `melshards synthesize` (`WAV`) |
| `inspect --out` | a mel PNG | the PNG `tEXt` chunk `Software` = `melshards inspect` (`PNG`) |
| `train --model-dir` | a model dir | a `train_config.json` in it (`MODEL_DIR_MARKS`) holding a JSON object of the train config's sections (`model_config_is_ours`), written before any checkpoint |
| `synthesize --export` | a SavedModel dir | `melshards-export.json` in it (`EXPORT_MARK`); an empty dir may be used |

No folder name marks a model dir: `checkpoints/` is every trainer's (a PyTorch Lightning project has
one). `preprocess --output` refuses any directory holding a `train_config.json` (`model_dir_marks`,
the name alone: a refusal writes nothing); `train` writes only where that file is its own
(`holds_model_config`). Local paths are read with `os`; other URLs (gs://) through the `fs` passed in,
by default `tf.io.gfile`, imported only then. Imports neither Beam nor TensorFlow at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import struct
from collections.abc import Callable
from typing import BinaryIO, Protocol

# what makes a directory a `melshards train` model dir (train/model_dir.py): its train_config.json, a JSON
# object of the train config's sections (train/config.py TrainConfig)
MODEL_CONFIG_FILE = "train_config.json"
MODEL_CONFIG_SECTIONS = ("data", "model", "optim", "loop")
MODEL_CONFIG_MAX_BYTES = 1 << 20  # a train config is a few KiB: a larger file is not one
MODEL_CHECKPOINT_DIR = "checkpoints"
MODEL_DIR_MARKS = (MODEL_CONFIG_FILE,)

HTML_GENERATOR = "melshards stats"
HTML_MARK = f'<meta name="generator" content="{HTML_GENERATOR}">'
WAV_SOFTWARE = "melshards synthesize"
PNG_SOFTWARE = "melshards inspect"
EXPORT_MARK = "melshards-export.json"  # written into a SavedModel dir by `synthesize --export`, after the model
HEAD_BYTES = 4096  # an HTML report's mark lies in its first line; a PNG's text chunks before its image data


class NotOurs(ValueError):
    """A path the command would write over or remove, which it cannot show it made: the message names
    it and what to do; the commands exit 2 with it and leave everything as it was."""


class Files(Protocol):
    """The file system calls the checks make (local paths use os whatever is passed)."""

    def exists(self, path: str) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def open(self, path: str) -> BinaryIO: ...

    def listdir(self, path: str) -> list[str]: ...


class _GFile:
    """tf.io.gfile, imported when a non-local path is checked."""

    def exists(self, path: str) -> bool:
        from tensorflow.io import gfile

        return gfile.exists(path)

    def isdir(self, path: str) -> bool:
        from tensorflow.io import gfile

        return gfile.isdir(path)

    def open(self, path: str) -> BinaryIO:
        from tensorflow.io import gfile

        return gfile.GFile(path, "rb")

    def listdir(self, path: str) -> list[str]:
        from tensorflow.io import gfile

        return gfile.listdir(path)


class _Local:
    def exists(self, path: str) -> bool:
        return os.path.lexists(path)  # a dangling link is in the way too

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def open(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


def files_for(path: str, fs: Files | None = None) -> Files:
    """os for a local path; `fs` (default tf.io.gfile) for a URL such as gs://."""
    return _Local() if "://" not in path else (fs or _GFile())


def html_is_ours(f: BinaryIO) -> bool:
    """The report `melshards stats --html` writes: its generator mark in the first bytes."""
    return HTML_MARK.encode("ascii") in f.read(HEAD_BYTES)


def wav_is_ours(f: BinaryIO) -> bool:
    """A RIFF/WAVE file whose LIST/INFO chunk holds an ISFT (software) naming `melshards synthesize`."""
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return False
    while True:
        header = f.read(8)
        if len(header) < 8:
            return False
        chunk, size = header[:4], struct.unpack("<I", header[4:])[0]
        skip = size + size % 2  # chunks are word-aligned
        if chunk == b"LIST":
            body = f.read(min(size, HEAD_BYTES))
            if body[:4] == b"INFO" and _info_software(body[4:]).startswith(WAV_SOFTWARE):
                return True
            skip -= len(body)
        f.seek(skip, os.SEEK_CUR)


def _info_software(info: bytes) -> str:
    """The ISFT entry of a LIST/INFO chunk's body, '' when it has none."""
    at = 0
    while at + 8 <= len(info):
        key, size = info[at : at + 4], struct.unpack("<I", info[at + 4 : at + 8])[0]
        if key == b"ISFT":
            return info[at + 8 : at + 8 + size].rstrip(b"\0").decode("utf-8", errors="replace")
        at += 8 + size + size % 2
    return ""


def png_is_ours(f: BinaryIO) -> bool:
    """A PNG whose tEXt chunk `Software` (before its image data) is `melshards inspect`."""
    data = f.read(HEAD_BYTES)
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    at = 8
    while at + 8 <= len(data):
        size, chunk = struct.unpack(">I", data[at : at + 4])[0], data[at + 4 : at + 8]
        if chunk == b"IDAT":
            return False
        if chunk == b"tEXt" and data[at + 8 : at + 8 + size] == b"Software\0" + PNG_SOFTWARE.encode("ascii"):
            return True
        at += 12 + size
    return False


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of file a command writes: what it is (for messages) and how to tell one it made."""

    what: str
    is_ours: Callable[[BinaryIO], bool]


HTML = Kind("an HTML report `melshards stats --html` wrote", html_is_ours)
WAV = Kind("a WAV `melshards synthesize` wrote", wav_is_ours)
PNG = Kind("a mel PNG `melshards inspect --show` wrote", png_is_ours)


def refusal(option: str, path: str, what: str) -> NotOurs:
    """The one message of the rule: `path` is in the way and is not `what`."""
    return NotOurs(
        f"{option} {path}: it exists and is not {what}, so it is left as it is; "
        "pass a path that does not exist yet, or move that one away first"
    )


def check_may_write(option: str, path: str, kind: Kind, fs: Files | None = None) -> None:
    """Nothing at `path`, or a file of `kind` this package made there; NotOurs otherwise (a directory,
    another file, one that cannot be read). Reads a few KiB of it at most; writes nothing."""
    files = files_for(path, fs)
    if not files.exists(path):
        return
    if files.isdir(path):
        raise refusal(option, path, kind.what)
    try:
        with files.open(path) as f:
            ours = kind.is_ours(f)
    except Exception as e:  # OSError, tf.errors.OpError of a remote read, a truncated chunk: not shown to be ours
        raise NotOurs(
            f"{option} {path}: it exists and cannot be read ({e}), so it is left as it is; "
            "pass a path that does not exist yet"
        ) from e
    if not ours:
        raise refusal(option, path, kind.what)


def check_may_fill_dir(option: str, path: str, mark: str, what: str, fs: Files | None = None) -> None:
    """Nothing at `path`, an empty directory, or a directory holding `mark` (the file the command writes
    into every directory it fills); NotOurs otherwise (a file, a directory of someone else's files)."""
    files = files_for(path, fs)
    if not files.exists(path):
        return
    try:
        names = files.listdir(path) if files.isdir(path) else None
    except Exception as e:  # OSError, tf.errors.OpError of a remote listing: not shown to be ours
        raise NotOurs(
            f"{option} {path}: it cannot be listed ({e}), so it is left as it is; pass a path that does not exist yet"
        ) from e
    if names is None or (names and mark not in {n.rstrip("/") for n in names}):
        raise refusal(option, path, what)


def model_dir_marks(names: set[str] | list[str]) -> list[str]:
    """Which of MODEL_DIR_MARKS a directory listing (base names, a trailing / allowed) holds: what
    `preprocess --output` refuses as a `melshards train` model dir, by the name alone."""
    held = {n.rstrip("/") for n in names}
    return [m for m in MODEL_DIR_MARKS if m in held]


def model_config_is_ours(f: BinaryIO) -> bool:
    """A train_config.json `melshards train` wrote: a JSON object whose keys are the train config's
    sections (MODEL_CONFIG_SECTIONS), each an object, the model's factory (if named: runs before model
    plug-ins did not) a string."""
    data = f.read(MODEL_CONFIG_MAX_BYTES + 1)
    if len(data) > MODEL_CONFIG_MAX_BYTES:
        return False
    try:
        config = json.loads(data)
    except ValueError:  # not JSON, not UTF-8
        return False
    return (
        isinstance(config, dict)
        and set(config) == set(MODEL_CONFIG_SECTIONS)
        and all(isinstance(config[k], dict) for k in MODEL_CONFIG_SECTIONS)
        and isinstance(config["model"].get("factory", ""), str)
    )


def holds_model_config(model_dir: str, fs: Files | None = None) -> bool:
    """Whether `model_dir` holds the train_config.json `melshards train` writes (`model_config_is_ours`):
    what makes it a model dir that training may write into. False when it cannot be read."""
    files = files_for(model_dir, fs)
    path = posixpath.join(model_dir, MODEL_CONFIG_FILE)
    try:
        if not files.exists(path) or files.isdir(path):
            return False
        with files.open(path) as f:
            return model_config_is_ours(f)
    except Exception:  # noqa: BLE001 (OSError, tf.errors.OpError of a remote read: not shown to be ours)
        return False
