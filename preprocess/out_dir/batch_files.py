"""The batches the stages hand on: each batch of rows from the read stage to Measure, and each
measured batch across the statistics barrier, as temp files (`temp_files`: how they are named,
written, read and removed, and why a retried bundle writes the same ones).

The read stage writes the batches of rows it reads into `rows-<name>.pkl` files, several batches to a
file (`write_rows`), and passes on where each batch is: the runner's shuffle that spreads the
batches over the workers holds a path and an offset per batch, not the corpus' rows.

Measure computes every clip's features once; the cut-offs and the buckets are known only once every
clip is measured. Rather than hold the batches in the runner (or decode every clip a second time),
Measure writes each batch into two files and passes on only their paths (`write_measured`):

- `clips-<name>.pkl`: the measured clips (ids, text, lengths, the mel's moments, the pitch and energy
  summaries, where the feature cache holds the clip's arrays), read by the bucket planner and the writer;
- `features-<name>.npz`: the clips' arrays (mel as float16, pitch, energy, audio, durations), read by
  the writer alone, once; none for a batch whose arrays the feature cache holds.

The runner then holds a few hundred bytes per batch between the stages, whatever the clips carry: a
local run's memory does not grow with the corpus.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir import temp_files
from melshards.preprocess.out_dir.duplicate_marks import mark_duplicates

ROWS_FILE_BYTES = 4 << 20  # the read stage's batches of rows, packed into files of about this size
DUPLICATES = "duplicates"  # on a measured batch: {clip id: id kept} of its clips that are duplicates


def write_rows(temp_dir: str, batches: Iterable[list[dict]]) -> Iterator[dict]:
    """Write batches of rows, packed into files of about ROWS_FILE_BYTES (a file per batch would be
    thousands of small objects); yields each batch's reference {"rows": path, "offset", "size",
    "count"} once its file is written (path None: a batch of no rows). A file is named by the ids of
    its rows."""
    refs: list[dict]
    ids: list[str]
    buffer, refs, ids = io.BytesIO(), [], []

    def flush():
        path = temp_files.write(
            FileSystems.join(temp_dir, temp_files.content_name("rows", ids, ".pkl")), buffer.getvalue()
        )
        return [dict(ref, rows=path) for ref in refs]

    for batch in batches:
        if not batch:
            yield {"rows": None, "offset": 0, "size": 0, "count": 0}
            continue
        offset = buffer.tell()
        pickle.dump(batch, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        refs.append({"offset": offset, "size": buffer.tell() - offset, "count": len(batch)})
        ids.extend(r["id"] for r in batch)
        if buffer.tell() >= ROWS_FILE_BYTES:
            yield from flush()
            buffer, refs, ids = io.BytesIO(), [], []
    if refs:
        yield from flush()


def read_rows(batch: dict) -> list[dict]:
    """The rows of a batch `write_rows` wrote, in order."""
    if batch["rows"] is None:
        return []
    rows = pickle.loads(temp_files.read(batch["rows"], batch["offset"], batch["size"]))  # this run's own file
    if len(rows) != batch["count"]:  # another count is a bug or a lost write
        raise OSError(f"{batch['rows']} holds {len(rows)} rows at {batch['offset']}, expected {batch['count']}")
    return rows


def write_measured(temp_dir: str, clips: list[dict], features: list[dict[str, np.ndarray]]) -> dict:
    """Write a batch's measured clips and their unpadded arrays (`features[i]` is `clips[i]`'s: the mel
    as float16, what the shards store; pitch, energy, audio, durations where the run computes them);
    returns the batch's reference {"clips": path, "features": path, "count": n}, both paths None for a
    batch of no clips, "features" None for clips without arrays. A clip the feature cache holds (found
    there, or added by this batch) is written without what the cache holds (it keeps durations): the
    writer reads the rest from the cache file its clip names (`"cached"`). Both files are named by the
    clips' ids.
    """
    if not clips:
        return {"clips": None, "features": None, "count": 0}
    ids = [c["id"] for c in clips]
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
        features_path = temp_files.write(
            FileSystems.join(temp_dir, temp_files.content_name("features", ids, ".npz")), buffer.getvalue()
        )
    return {
        "clips": temp_files.write(
            FileSystems.join(temp_dir, temp_files.content_name("clips", ids, ".pkl")),
            pickle.dumps(clips, protocol=pickle.HIGHEST_PROTOCOL),
        ),
        "features": features_path,
        "count": len(clips),
    }


def read_clips(batch: dict) -> list[dict]:
    """The measured clips of a batch `write_measured` wrote, in order; in a batch joined with its
    duplicate verdicts (`DUPLICATES`, `quality_stage.DuplicateAudio`), each duplicate marked with the id
    kept (`duplicate_marks.mark_duplicates`)."""
    if batch["clips"] is None:
        return []
    clips = pickle.loads(temp_files.read(batch["clips"]))  # this run's own file
    if len(clips) != batch["count"]:  # another count is a bug or a lost write
        raise OSError(f"{batch['clips']} holds {len(clips)} clips, expected {batch['count']}")
    return mark_duplicates(clips, batch[DUPLICATES]) if batch.get(DUPLICATES) else clips


def read_features(batch: dict) -> list[dict[str, np.ndarray]]:
    """The arrays of a batch's clips `write_measured` wrote, in the clips' order."""
    count = batch["count"]
    if batch["features"] is None:  # a batch of no clips, or of clips without arrays
        return [{} for _ in range(count)]
    out: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    with np.load(io.BytesIO(temp_files.read(batch["features"]))) as npz:
        stored = int(npz["count"][0])
        for key in npz.files:
            if key != "count":
                i, name = key.split("/", 1)
                out[int(i)][name] = npz[key]
    if stored != count:
        raise OSError(f"{batch['features']} holds the features of {stored} clips, expected {count}")
    return out
