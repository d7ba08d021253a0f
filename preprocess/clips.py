"""Stages 2-3: per-clip work. Thin DoFns over the pure functions in text.py and audio.py.

`measure` decodes a clip and computes its lengths (cheap); `featurize` computes the log-mel for
clips that survived the percentile filter. Audio is decoded twice, the mel is computed once: no
mel array is held while the global statistics are still being gathered.
"""
from __future__ import annotations

import numpy as np
from apache_beam.io.filesystems import FileSystems

from preprocess import audio as A
from preprocess.config import PreprocessConfig
from preprocess.corpus import reject
from shards_schema.text import TextRejected, check_text
from shards_schema import Vocabulary


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
    """Decode, resample, downmix, reject silence, trim. Raises ClipRejected with the reason."""
    data = _read_bytes(path)
    try:
        y, _ = A.decode_audio(data, cfg.audio.sample_rate)
    except A.AudioError as e:
        raise ClipRejected("unreadable_audio", f"{path}: {e}") from e
    peak = A.peak_dbfs(y)
    if peak < cfg.audio.silence_peak_dbfs:
        raise ClipRejected("silent_audio", f"peak {peak:.1f} dBFS < {cfg.audio.silence_peak_dbfs} dBFS")
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


def measure(row: dict, cfg: PreprocessConfig, vocab: Vocabulary) -> dict:
    """Row -> row + normalised text, ids and the three lengths the statistics are made of."""
    text, ids, _ = prepare_text(row["text"], vocab)
    y = load_trimmed(row["audio"], cfg)
    return dict(row, text=text, text_ids=ids, text_len=len(ids), num_samples=int(y.size),
                mel_frames=A.num_frames(y.size, cfg.mel.hop_length),
                duration_ms=int(round(1000 * y.size / cfg.audio.sample_rate)))


def featurize(clip: dict, cfg: PreprocessConfig) -> dict:
    """Measured clip -> clip + log-mel [frames, n_mels] float32 (the project's one mel computation)."""
    y = load_trimmed(clip["audio"], cfg)
    if y.size != clip["num_samples"]:
        raise ClipRejected("unreadable_audio", f"decoded to {y.size} samples, {clip['num_samples']} "
                                               "when measured: the file changed during the run")
    mel = A.log_mel(y, cfg.audio.sample_rate, cfg.mel)
    return dict(clip, mel=mel)


def as_rejection(clip_id: str, e: ClipRejected) -> dict:
    return reject(clip_id, e.reason, e.detail)
