"""The read stage's working set on local disk: sqlite tables in place of the dicts and lists a reader
would hold, so reading a corpus holds a few megabytes whatever its number of rows.

A `WorkingSet` is one sqlite database (a file in the read worker's temp dir, or `:memory:` for a
small read such as `sources.read_input`), written by one thread. What lives in it:

- a `SqliteMap` of the first row of every id (`rows.unique_ids`) and a `SqliteLists` of the audio
  files of every LJSpeech id (`layouts.audio_files`), mappings the pure readers take like dicts;
- the items of every input in order, and the labels each input has (`merge.MergedInputs`);
- the segments of long recordings kept so far (`packed_clips.refuse_overlaps`).

It is no channel between stages: one attempt of the read stage makes it in a temp dir of its own,
reads it back itself and drops it when the read ends (`read_stage._ReadRows`), so a retried bundle
starts a new one and no other stage or attempt sees it; what the read hands on goes through the
run's temp files (`melshards.preprocess.out_dir.temp_files`). sqlite is in Python's standard library
and is a local file: no rows travel to a server, and nothing in it is kept across runs.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, MutableMapping

_CACHE_KIB = 16 * 1024  # sqlite's page cache per database; the rest stays on disk


class WorkingSet:
    """One sqlite database for one read; `path` ":memory:" keeps it in memory (small reads)."""

    def __init__(self, path: str = ":memory:"):
        self.db = sqlite3.connect(path, isolation_level=None)
        for pragma in (
            "journal_mode = OFF",
            "synchronous = OFF",
            f"cache_size = -{_CACHE_KIB}",
            "temp_store = FILE",
        ):  # a temp file to be discarded: no journal, no fsync
            self.db.execute(f"PRAGMA {pragma}")
        self.db.execute("BEGIN")  # one transaction for the whole read: never committed, so no commit per write
        self.tables = 0

    def table(self, prefix: str) -> str:
        """A new table name of this database (`prefix` and a number)."""
        self.tables += 1
        return f"{prefix}_{self.tables}"

    def map(self) -> SqliteMap:
        """A new, empty `SqliteMap` in this database."""
        return SqliteMap(self.db, self.table("map"))

    def lists(self, triples: Iterable[tuple[str, int, str]]) -> SqliteLists:
        """A new `SqliteLists` in this database, of `(key, rank, value)` triples."""
        return SqliteLists(self.db, self.table("lists"), triples)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> WorkingSet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SqliteMap(MutableMapping):
    """A `str -> JSON value` mapping kept in a sqlite table; iteration in key order."""

    def __init__(self, db: sqlite3.Connection, table: str):
        self.db, self.table = db, table
        db.execute(f"CREATE TABLE {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")

    def __getitem__(self, key: str):
        found = self.db.execute(f"SELECT value FROM {self.table} WHERE key = ?", (key,)).fetchone()
        if found is None:
            raise KeyError(key)
        return json.loads(found[0])

    def __setitem__(self, key: str, value) -> None:
        self.db.execute(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", (key, json.dumps(value)))

    def __delitem__(self, key: str) -> None:
        if not self.db.execute(f"DELETE FROM {self.table} WHERE key = ?", (key,)).rowcount:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for (k,) in self.db.execute(f"SELECT key FROM {self.table} ORDER BY key"))

    def __len__(self) -> int:
        return self.db.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]

    def setdefault(self, key: str, default=None):
        """One statement when the key is new (MutableMapping's takes a lookup and a write)."""
        if self.db.execute(f"INSERT OR IGNORE INTO {self.table} VALUES (?, ?)", (key, json.dumps(default))).rowcount:
            return default
        return self[key]


class SqliteLists(Mapping):
    """A `str -> list[str]` mapping kept in a sqlite table, built once from `(key, rank, value)`
    triples (one statement for all of them): a key's list holds its values by rank, then value."""

    def __init__(self, db: sqlite3.Connection, table: str, triples: Iterable[tuple[str, int, str]]):
        self.db, self.table = db, table
        db.execute(f"CREATE TABLE {table} (key TEXT NOT NULL, rank INTEGER NOT NULL, value TEXT NOT NULL)")
        db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", triples)
        db.execute(f"CREATE INDEX {table}_key ON {table} (key, rank, value)")

    def __getitem__(self, key: str) -> list[str]:
        found = [
            v for (v,) in self.db.execute(f"SELECT value FROM {self.table} WHERE key = ? ORDER BY rank, value", (key,))
        ]
        if not found:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[str]:
        return (k for (k,) in self.db.execute(f"SELECT DISTINCT key FROM {self.table} ORDER BY key"))

    def __len__(self) -> int:
        return self.db.execute(f"SELECT COUNT(DISTINCT key) FROM {self.table}").fetchone()[0]
