"""The persistent XLA cache: compiled steps kept across runs (`--tf_xla_persistent_cache_directory`).

`melshards train` turns it on before TensorFlow is imported: in $MELSHARDS_XLA_CACHE, else
$XDG_CACHE_HOME/melshards/xla (~/.cache/melshards/xla); an empty MELSHARDS_XLA_CACHE turns it off, and
a directory TF_XLA_FLAGS already names is left as it is. TensorFlow reads TF_XLA_FLAGS once per
process, when it sets up its devices (train/tf_quiet.py does at import), so this module imports no
TensorFlow. Entries are keyed by the function's name and its HLO; train/compile.py traces in a fixed
order so that a resumed run and a re-run with the same shapes find theirs.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

CACHE_FLAG = "--tf_xla_persistent_cache_directory"


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
    os.environ["TF_XLA_FLAGS"] = f"{flags} {CACHE_FLAG}={directory}".strip()
    return directory
