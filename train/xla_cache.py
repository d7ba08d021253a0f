"""The persistent XLA cache: compiled steps kept across runs (`--tf_xla_persistent_cache_directory`).

`melshards train` and `melshards synthesize` turn it on before TensorFlow is imported: in $MELSHARDS_XLA_CACHE, else
$XDG_CACHE_HOME/melshards/xla (~/.cache/melshards/xla); an empty MELSHARDS_XLA_CACHE turns it off, and
a directory TF_XLA_FLAGS already names is left as it is. TensorFlow reads TF_XLA_FLAGS once per
process, when it sets up its devices (train/tf_quiet.py does at import), so this module imports no
TensorFlow. Entries are keyed by the function's name and its HLO; train/compile.py traces in a fixed
order so that a resumed run and a re-run with the same shapes find theirs; a new `melshards synthesize`
process traces generate under the names the previous one used for the same model, and finds its program.

XLA never removes an entry: each start of either command prunes the directory it chose to
`MAX_BYTES`, the least recently used programs first (`prune`).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

CACHE_FLAG = "--tf_xla_persistent_cache_directory"
MAX_BYTES = 2 << 30  # the compiled programs kept: a model's steps for a few configs and shapes
ENTRY = re.compile(r"xla_compile_cache__.+\.pb|melshards_program__.+\.npz")  # a compiled program; a saved step


def default_cache_dir() -> str | None:
    """Where compiled steps are kept: $MELSHARDS_XLA_CACHE ("" turns it off), else the user's cache dir."""
    if "MELSHARDS_XLA_CACHE" in os.environ:
        return os.environ["MELSHARDS_XLA_CACHE"] or None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "melshards" / "xla")


def cache_dir_in_flags(flags: str) -> str | None:
    """The persistent cache directory TF_XLA_FLAGS names, if any."""
    m = re.search(CACHE_FLAG + r"=(\S+)", flags)
    return m.group(1) if m else None


def enable_persistent_cache(directory: str | None = None) -> str | None:
    """Add the persistent cache to TF_XLA_FLAGS (before this process's first XLA compile); returns the
    directory in use, or None when it is off. A directory TF_XLA_FLAGS already names wins."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    named = cache_dir_in_flags(flags)
    if named:
        return named
    directory = directory if directory is not None else default_cache_dir()
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    try:
        prune(directory)
    except OSError as e:  # the cache only grows: the command goes on
        logging.getLogger("melshards.train").warning("could not trim the XLA cache %s: %s", directory, e)
    os.environ["TF_XLA_FLAGS"] = f"{flags} {CACHE_FLAG}={directory}".strip()
    return directory


def prune(directory: str, max_bytes: int | None = None) -> tuple[int, int]:
    """Remove compiled programs (XLA's `xla_compile_cache__*.pb`, nothing else) from `directory`, the least
    recently used first, until the rest hold at most `max_bytes` (`MAX_BYTES`); returns (files removed,
    bytes freed).
    A program's last use is the later of its access and modification times (XLA reads an entry without
    writing it; a relatime mount updates the access time at least daily)."""
    entries = []
    with os.scandir(directory) as it:
        for e in it:
            if ENTRY.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                entries.append((max(st.st_atime, st.st_mtime), st.st_size, e.path))
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    total, removed, freed = sum(size for _, size, _ in entries), 0, 0
    for _, size, path in sorted(entries):
        if total - freed <= max_bytes:
            break
        try:
            os.remove(path)
        except FileNotFoundError:  # another run trimmed it
            pass
        removed, freed = removed + 1, freed + size
    return removed, freed
