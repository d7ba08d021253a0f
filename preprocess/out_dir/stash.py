"""The stash: a side channel of temp files outside Beam's model, that carries the batches of rows
from the read stage to the workers and each measured batch across the statistics barrier.

The read stage writes the batches of rows it reads into `rows-<name>.pkl` files, several batches to a
file (`stash_rows`), and passes on where each batch is: the runner's shuffle that spreads the
batches over the workers holds a path and an offset per batch, not the corpus' rows.

Measure computes every clip's features once; the cut-offs and the buckets are known only once every
clip is measured. Rather than hold the batches in the runner (or decode every clip a second time),
Measure writes each batch into two files here and passes on only their paths (`stash_batch`):

- `clips-<name>.pkl`: the measured clips (ids, text, lengths, the mel's moments, the pitch and energy
  summaries, where the feature cache holds the clip's arrays), read by the bucket planner and the writer;
- `features-<name>.npz`: the clips' arrays (mel as float16, pitch, energy, audio, durations), read by
  the writer alone, once; none for a batch whose arrays the feature cache holds.

The runner then holds a few hundred bytes per batch between the stages, whatever the clips carry: a
local run's memory does not grow with the corpus. The stash is the run's temp dir, removed by the
report stage.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections.abc import Iterable, Iterator

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir.duplicate_marks import mark_duplicates
from melshards.preprocess.out_dir.shards import TEMP_DIR, create_file

ROWS_FILE_BYTES = 4 << 20  # the read stage's batches of rows, packed into files of about this size
DUPLICATES = "duplicates"  # on a stashed batch: {clip id: id kept} of its clips that are duplicates


def stash_dir(out_dir: str) -> str:
    """Where the measured batches wait for the cut-offs: the output's temp dir, emptied by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


def batch_name(ids: Iterable[str]) -> str:
    """A batch's name in the temp dir: the sha1 of its ids (unique in a run), the same in every attempt."""
    return hashlib.sha1("\n".join(ids).encode("utf-8")).hexdigest()


def _write(path: str, data: bytes) -> str:
    with create_file(path) as f:
        f.write(data)
    return path


def _read(path: str) -> bytes:
    with FileSystems.open(path) as f:
        return f.read()


def stash_rows(stash_dir: str, batches: Iterable[list[dict]]) -> Iterator[dict]:
    """Write batches of rows, packed into files of about ROWS_FILE_BYTES (a file per batch would be
    thousands of small objects); yields each batch's reference {"rows": path, "offset", "size",
    "count"} once its file is written (path None: a batch of no rows).

    A file's name comes from its ids, so a retried bundle rewrites the same files instead of adding more.
    """
    refs: list[dict]
    buffer, refs, ids = io.BytesIO(), [], hashlib.sha1()

    def flush():
        path = FileSystems.join(stash_dir, f"rows-{ids.hexdigest()}.pkl")
        _write(path, buffer.getvalue())
        return [dict(ref, rows=path) for ref in refs]

    for batch in batches:
        if not batch:
            yield {"rows": None, "offset": 0, "size": 0, "count": 0}
            continue
        offset = buffer.tell()
        pickle.dump(batch, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        refs.append({"offset": offset, "size": buffer.tell() - offset, "count": len(batch)})
        ids.update("\n".join(r["id"] for r in batch).encode("utf-8"))
        if buffer.tell() >= ROWS_FILE_BYTES:
            yield from flush()
            buffer, refs, ids = io.BytesIO(), [], hashlib.sha1()
    if refs:
        yield from flush()


def load_rows(batch: dict) -> list[dict]:
    """The rows of a batch `stash_rows` wrote, in order."""
    if batch["rows"] is None:
        return []
    with FileSystems.open(batch["rows"]) as f:
        f.seek(batch["offset"])
        rows = pickle.loads(f.read(batch["size"]))  # our own temp file, written by this run
    if len(rows) != batch["count"]:  # another count is a bug or a lost write
        raise OSError(f"{batch['rows']} holds {len(rows)} rows at {batch['offset']}, expected {batch['count']}")
    return rows


def stash_batch(stash_dir: str, clips: list[dict], features: list[dict[str, np.ndarray]]) -> dict:
    """Write a batch's measured clips and their unpadded arrays (`features[i]` is `clips[i]`'s: the mel
    as float16, what the shards store; pitch, energy, audio, durations where the run computes them);
    returns the batch's reference {"clips": path, "features": path, "count": n}, both paths None for a
    batch of no clips, "features" None for clips without arrays. A clip the feature cache holds (found
    there, or added by this batch) stashes only what the cache lacks (durations): the writer reads
    the rest from the cache file its clip names (`"cached"`).
    """
    if not clips:
        return {"clips": None, "features": None, "count": 0}
    name = batch_name(c["id"] for c in clips)
    arrays = {
        f"{i}/{key}": (value.astype("<f2") if key == "mel" else value)
        for i, clip in enumerate(features)
        for key, value in clip.items()
    }
    features_path = None
    if arrays:  # none when every clip's arrays are in the feature cache
        arrays["count"] = np.array([len(features)], np.int64)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # mypy matches **arrays with savez's allow_pickle: bool too (numpy >= 2.1); no array has that name
        features_path = _write(FileSystems.join(stash_dir, f"features-{name}.npz"), buffer.getvalue())
    return {
        "clips": _write(
            FileSystems.join(stash_dir, f"clips-{name}.pkl"), pickle.dumps(clips, protocol=pickle.HIGHEST_PROTOCOL)
        ),
        "features": features_path,
        "count": len(clips),
    }


def load_clips(batch: dict) -> list[dict]:
    """The measured clips of a batch `stash_batch` wrote, in order; in a batch joined with its
    duplicate verdicts (`DUPLICATES`, `global_stats.DuplicateAudio`), each duplicate marked with the id
    kept (`quality_rules.mark_duplicates`)."""
    if batch["clips"] is None:
        return []
    clips = pickle.loads(_read(batch["clips"]))  # our own temp file, written by this run
    if len(clips) != batch["count"]:  # another count is a bug or a lost write
        raise OSError(f"{batch['clips']} holds {len(clips)} clips, expected {batch['count']}")
    return mark_duplicates(clips, batch[DUPLICATES]) if batch.get(DUPLICATES) else clips


def load_features(batch: dict) -> list[dict[str, np.ndarray]]:
    """The arrays of a batch's clips `stash_batch` wrote, in the clips' order."""
    count = batch["count"]
    if batch["features"] is None:  # a batch of no clips, or of clips without arrays
        return [{} for _ in range(count)]
    out: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    with np.load(io.BytesIO(_read(batch["features"]))) as npz:
        stored = int(npz["count"][0])
        for key in npz.files:
            if key != "count":
                i, name = key.split("/", 1)
                out[int(i)][name] = npz[key]
    if stored != count:
        raise OSError(f"{batch['features']} holds the features of {stored} clips, expected {count}")
    return out
