"""Stages 2-3: per-clip work. Thin DoFns over the pure functions in text.py and audio.py.

`featurize` reads, decodes, resamples and trims a clip once and computes its lengths and its log-mel
in the same pass; the job carries the mel across the statistics
barrier (see pipeline.py) instead of decoding the clip a second time. `measure` is the lengths
alone, for tools that need no mel.
"""
from __future__ import annotations

import hashlib

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess import audio as A
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.corpus import reject
from melshards.shards_schema.text import TextRejected, check_text
from melshards.shards_schema import Vocabulary


class ClipRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def _read_bytes(path: str | None) -> bytes:
    if path is None:
        raise ClipRejected("missing_audio", "no audio file for this id")
    try:
        with FileSystems.open(path) as f:
            return f.read()
    except (OSError, IOError) as e:  # BeamIOError is an IOError
        if not FileSystems.exists(path):
            raise ClipRejected("missing_audio", f"{path} does not exist") from e
        raise ClipRejected("unreadable_audio", f"{path}: {e}") from e


def load_trimmed(path: str | None, cfg: PreprocessConfig) -> np.ndarray:
    """Decode, downmix, remove the DC offset, resample, reject silence, trim. Raises ClipRejected with
    the reason."""
    data = _read_bytes(path)
    try:
        y, _ = A.decode_audio(data, cfg.audio.sample_rate)
    except A.InvalidSamples as e:
        raise ClipRejected("invalid_samples", f"{path}: {e}") from e
    except A.AudioError as e:
        raise ClipRejected("unreadable_audio", f"{path}: {e}") from e
    peak = A.peak_dbfs(y)  # of the samples less their DC offset: a constant is not sound
    if peak == -np.inf:
        raise ClipRejected("silent_audio", "no signal: every sample has the same value (digital silence or "
                                           "a constant DC offset)")
    if peak < cfg.audio.silence_peak_dbfs:
        raise ClipRejected("silent_audio", f"peak {peak:.1f} dBFS (DC offset removed) < "
                                           f"{cfg.audio.silence_peak_dbfs} dBFS")
    y = A.trim(y, cfg.audio)
    if y.size == 0:
        raise ClipRejected("silent_audio", "nothing left after trimming silence")
    return y


def prepare_text(raw: str, vocab: Vocabulary) -> tuple[str, list[int], int]:
    try:
        text = check_text(raw)
    except TextRejected as e:
        raise ClipRejected(e.reason, e.detail) from e
    ids, skipped = vocab.encode(text)
    return text, ids, skipped


def _measured(row: dict, text: str, ids: list[int], y: np.ndarray, cfg: PreprocessConfig) -> dict:
    return dict(row, text=text, text_ids=ids, text_len=len(ids), num_samples=int(y.size),
                mel_frames=A.num_frames(y.size, cfg.mel.hop_length),
                duration_ms=int(round(1000 * y.size / cfg.audio.sample_rate)))


def measure(row: dict, cfg: PreprocessConfig, vocab: Vocabulary) -> dict:
    """Row -> row + normalised text, ids and the three lengths the statistics are made of."""
    text, ids, _ = prepare_text(row["text"], vocab)
    return _measured(row, text, ids, load_trimmed(row["audio"], cfg), cfg)


def featurize(row: dict, cfg: PreprocessConfig, vocab: Vocabulary) -> dict:
    """Row -> measured clip + log-mel [frames, n_mels] float32 (the project's one mel computation)."""
    text, ids, _ = prepare_text(row["text"], vocab)
    y = load_trimmed(row["audio"], cfg)
    return dict(_measured(row, text, ids, y, cfg), mel=A.log_mel(y, cfg.audio.sample_rate, cfg.mel))


def as_rejection(clip_id: str, e: ClipRejected) -> dict:
    return reject(clip_id, e.reason, e.detail)


# -- the mels across the statistics barrier --------------------------------------------------
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
