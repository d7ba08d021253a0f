"""The mel stash: a side channel of temp files outside Beam's model, that carries each batch's mels
across the statistics barrier.

Measure computes every mel once; the cut-offs and the buckets are known only once every clip is
measured. Rather than hold the mels in the runner (or decode every clip a second time), Measure
writes each batch's mels into one file here and passes its path on; FilterAndWrite reads the file
back once. The stash is the run's temp dir, removed by the report stage.
"""
from __future__ import annotations

import hashlib

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.shards import TEMP_DIR


def mel_stash_dir(out_dir: str) -> str:
    """Where mels wait for the cut-offs: the output's temp dir, emptied by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


def stash_mels(stash_dir: str, clip_ids: list[str], mels: list[np.ndarray]) -> str:
    """Write a batch's unpadded mels, concatenated, as raw little-endian float16 (what the shards
    store); returns the path. Each clip's frame count says where its mel starts.

    The name comes from the ids, so a retried bundle rewrites the same file instead of adding one.
    """
    name = hashlib.sha1("\n".join(clip_ids).encode("utf-8")).hexdigest()
    path = FileSystems.join(stash_dir, f"mels-{name}.f16")
    with FileSystems.create(path) as f:
        for mel in mels:
            f.write(np.ascontiguousarray(mel, "<f2").tobytes())
    return path


def load_mels(path: str, frames: list[int], n_mels: int) -> list[np.ndarray]:
    """The mels `stash_mels` wrote, given each one's frame count, in order."""
    with FileSystems.open(path) as f:
        data = f.read()
    if len(data) != 2 * sum(frames) * n_mels:  # our own temp file: a short one is a bug or a lost write
        raise IOError(f"{path} holds {len(data)} bytes, expected {sum(frames)} x {n_mels} float16")
    flat = np.frombuffer(data, "<f2").reshape(-1, n_mels)
    ends = np.cumsum(frames)
    return [flat[end - n:end] for n, end in zip(frames, ends)]
