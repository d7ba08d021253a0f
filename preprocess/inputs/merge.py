"""Several inputs in one run: their names, and labels kept unique across them.

Each input has a name: its directory's or file's stem, made unique (`name`, `name-2`, ...). A
speaker label found in more than one input is prefixed with the input's name (`NAME/label`) in every
input that has it; clip ids likewise, so two corpora that both have a clip `0001` keep both (a
repeat within one input is still `duplicate_id`). Labels found in one input only are left as they are.
A prefixed row keeps its labels as its input gives them (`as_given`): files made from that input
alone, such as Montreal Forced Aligner's TextGrids, are named after those. Every row carries the
index of its input (`INPUT`: 0 for the first --input), so a rule that keeps one of several clips
(`duplicate_audio`) keeps the first by input order, (input, row), of those that pass the other rules.
"""

from __future__ import annotations

import pickle
import posixpath
from collections.abc import Iterable, Iterator, Sequence

from melshards.preprocess.inputs.manifests import MANIFEST_EXTENSIONS
from melshards.preprocess.inputs.packed_clips import PARQUET_EXTENSIONS, TAR_EXTENSIONS
from melshards.preprocess.inputs.rows import is_rejection
from melshards.preprocess.inputs.working_set import WorkingSet

GIVEN_ID, GIVEN_SPEAKER = "given_id", "given_speaker"  # on a prefixed row: the label before the prefix
INPUT = "input"  # on every row: the index of its input among the run's --input options
INPUT_EXTENSIONS = (*MANIFEST_EXTENSIONS, *PARQUET_EXTENSIONS, *TAR_EXTENSIONS)  # a file --input can be


def as_given(row: dict) -> tuple[str, str]:
    """A row's (id, speaker) as its input gives them, without the `NAME/` prefix `MergedInputs` may
    have added."""
    return row.get(GIVEN_ID, row["id"]), row.get(GIVEN_SPEAKER, row.get("speaker", ""))


def input_name(path: str) -> str:
    """An input's name: its directory's name, or its file's stem, without the extension of any file
    an input can be (`/data/LJSpeech-1.1/` -> `LJSpeech-1.1`, `gs://b/cv/cy/validated.tsv` ->
    `validated`, `binary.parquet` -> `binary`, `shard-000.tar` -> `shard-000`)."""
    base = posixpath.basename(path.rstrip("/")) or path
    ext = next((e for e in INPUT_EXTENSIONS if base.lower().endswith(e)), "")
    return base[: len(base) - len(ext)] or base


def unique_names(names: Sequence[str]) -> list[str]:
    """Names in order, a repeat renamed `name-2`, `name-3`, ... (never to a name another input has)."""
    out: list[str] = []
    for name in names:
        unique, n = name, 1
        while unique in out or (unique != name and unique in names):
            n += 1
            unique = f"{name}-{n}"
        out.append(unique)
    return out


class MergedInputs:
    """Every input's items (`[(name, items)]`, ids unique within each input) -> its `rows()` and its
    `rejections()`, input after input in order, a label found in more than one input prefixed
    `name/label` in each: a speaker of rows, an id of rows or rejections (so rejected.jsonl names one
    row per id). A prefixed row holds its label as given too (`GIVEN_ID`, `GIVEN_SPEAKER`; `as_given`);
    every row holds its input's index (`INPUT`).

    Whether a label is shared is known only once every input is read: the items wait in the working set's
    tables (a file on local disk for a corpus, not a list in memory) and are read back from there.
    `input_rows[i]`, `prefixed_speakers[i]` and `prefixed_ids[i]` count input i's items and its
    distinct labels prefixed; `row_count` is the number of rows of all inputs.
    """

    def __init__(self, inputs: Sequence[tuple[str, Iterable[dict]]], working_set: WorkingSet):
        self.names = [name for name, _ in inputs]
        self.db, self.items = working_set.db, working_set.table("items")
        self.shared = {kind: working_set.table(f"shared_{kind}") for kind in ("id", "speaker")}
        self.db.execute(
            f"CREATE TABLE {self.items} (n INTEGER PRIMARY KEY, inp INTEGER NOT NULL, id TEXT NOT NULL, "
            "speaker TEXT, body BLOB NOT NULL)"
        )  # speaker NULL: a rejection
        self.input_rows, self.row_count = [], 0
        insert = f"INSERT INTO {self.items} (inp, id, speaker, body) VALUES (?, ?, ?, ?)"
        for i, (_, items) in enumerate(inputs):
            count = 0
            for item in items:
                speaker = None if is_rejection(item) else item["speaker"]
                self.db.execute(insert, (i, item["id"], speaker, pickle.dumps(item, pickle.HIGHEST_PROTOCOL)))
                count += 1
                self.row_count += speaker is not None
            self.input_rows.append(count)
        for kind, table in self.shared.items():
            self.db.execute(f"CREATE TABLE {table} (label TEXT PRIMARY KEY) WITHOUT ROWID")
            if len(inputs) > 1:  # one input shares no label
                self.db.execute(
                    f"INSERT INTO {table} SELECT {kind} FROM {self.items} WHERE {kind} IS NOT NULL "
                    f"GROUP BY {kind} HAVING COUNT(DISTINCT inp) > 1"
                )
        self.prefixed_speakers, self.prefixed_ids = (self._prefixed(kind) for kind in ("speaker", "id"))

    def _prefixed(self, kind: str) -> list[int]:
        counts = dict(
            self.db.execute(
                f"SELECT inp, COUNT(DISTINCT {kind}) FROM {self.items} "
                f"JOIN {self.shared[kind]} ON label = {kind} GROUP BY inp"
            )
        )
        return [counts.get(i, 0) for i in range(len(self.names))]

    def rows(self) -> Iterator[dict]:
        return self._items("IS NOT NULL")

    def rejections(self) -> Iterator[dict]:
        return self._items("IS NULL")

    def _items(self, speaker: str) -> Iterator[dict]:
        query = (
            f"SELECT i.inp, i.body, si.label IS NOT NULL, ss.label IS NOT NULL FROM {self.items} i "
            f"LEFT JOIN {self.shared['id']} si ON si.label = i.id "
            f"LEFT JOIN {self.shared['speaker']} ss ON ss.label = i.speaker WHERE i.speaker {speaker} "
            "ORDER BY i.n"
        )
        for inp, body, shared_id, shared_speaker in self.db.execute(query):
            item, name = pickle.loads(body), self.names[inp]
            row = not is_rejection(item)
            if row:
                item[INPUT] = inp
            if shared_id:
                if row:
                    item[GIVEN_ID] = item["id"]
                item["id"] = f"{name}/{item['id']}"
            if shared_speaker:
                item[GIVEN_SPEAKER] = item["speaker"]
                item["speaker"] = f"{name}/{item['speaker']}"
            yield item
