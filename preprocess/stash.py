"""The feature stash: a side channel of temp files outside Beam's model, that carries each batch's
mels (and pitch, energy, audio, durations) across the statistics barrier.

Measure computes every clip's features once; the cut-offs and the buckets are known only once every
clip is measured. Rather than hold the features in the runner (or decode every clip a second time), Measure
writes each batch's features into one file here and passes its path on; FilterAndWrite reads the file
back once. The stash is the run's temp dir, removed by the report stage.
"""
from __future__ import annotations

import hashlib
import io

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.shards import TEMP_DIR


def stash_dir(out_dir: str) -> str:
    """Where features wait for the cut-offs: the output's temp dir, emptied by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


def stash_features(stash_dir: str, clip_ids: list[str], features: list[dict[str, np.ndarray]]) -> str:
    """Write a batch's unpadded per-clip arrays (the mel as float16, what the shards store; pitch,
    energy, audio, durations where the run computes them) into one uncompressed .npz; returns the path.
    A clip read from the feature cache stashes only what the cache lacks (durations): the writer
    reads the rest from the cache file (`refs` of the batch).

    The name comes from the ids, so a retried bundle rewrites the same file instead of adding one.
    """
    name = hashlib.sha1("\n".join(clip_ids).encode("utf-8")).hexdigest()
    path = FileSystems.join(stash_dir, f"features-{name}.npz")
    arrays = {f"{i}/{key}": (value.astype("<f2") if key == "mel" else value)
              for i, clip in enumerate(features) for key, value in clip.items()}
    arrays["count"] = np.array([len(features)], np.int64)  # clips may hold nothing (read from the cache)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with FileSystems.create(path) as f:
        f.write(buffer.getvalue())
    return path


def load_features(path: str, count: int) -> list[dict[str, np.ndarray]]:
    """The `count` clips' arrays `stash_features` wrote, in order."""
    with FileSystems.open(path) as f:
        data = f.read()
    out: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    with np.load(io.BytesIO(data)) as npz:
        stored = int(npz["count"][0])
        for key in npz.files:
            if key != "count":
                i, name = key.split("/", 1)
                out[int(i)][name] = npz[key]
    if stored != count:  # our own temp file: another count is a bug or a lost write
        raise IOError(f"{path} holds the features of {stored} clips, expected {count}")
    return out
