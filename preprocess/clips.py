"""Per-clip work, the pure functions the job's DoFns call: measure a clip (stages 2-3), its split,
and the percentile filter's rule (stage 5).

`featurize` reads, decodes, resamples and trims a clip once and computes its lengths and its log-mel
in the same pass; the job carries the mel across the statistics barrier (`melshards.preprocess.stash`)
instead of decoding the clip a second time. `measure` is the lengths alone, for tools that need no mel.
`filter_rejection` is the one filter rule: the buckets are chosen from the clips it keeps, and the
writer drops the clips it rejects.
"""
from __future__ import annotations

import hashlib

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess import audio
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.rows import reject
from melshards.shards_schema.stats import Cutoffs
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
        y, _ = audio.decode_audio(data, cfg.audio.sample_rate)
    except audio.InvalidSamples as e:
        raise ClipRejected("invalid_samples", f"{path}: {e}") from e
    except audio.AudioError as e:
        raise ClipRejected("unreadable_audio", f"{path}: {e}") from e
    peak = audio.peak_dbfs(y)  # of the samples less their DC offset: a constant is not sound
    if peak == -np.inf:
        raise ClipRejected("silent_audio", "no signal: every sample has the same value (digital silence or "
                                           "a constant DC offset)")
    if peak < cfg.audio.silence_peak_dbfs:
        raise ClipRejected("silent_audio", f"peak {peak:.1f} dBFS (DC offset removed) < "
                                           f"{cfg.audio.silence_peak_dbfs} dBFS")
    y = audio.trim(y, cfg.audio)
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
                mel_frames=audio.num_frames(y.size, cfg.mel.hop_length),
                duration_ms=int(round(1000 * y.size / cfg.audio.sample_rate)))


def measure(row: dict, cfg: PreprocessConfig, vocab: Vocabulary) -> dict:
    """Row -> row + normalised text, ids and the three lengths the statistics are made of."""
    text, ids, _ = prepare_text(row["text"], vocab)
    return _measured(row, text, ids, load_trimmed(row["audio"], cfg), cfg)


def featurize(row: dict, cfg: PreprocessConfig, vocab: Vocabulary) -> dict:
    """Row -> measured clip + log-mel [frames, n_mels] float32 (the project's one mel computation)."""
    text, ids, _ = prepare_text(row["text"], vocab)
    y = load_trimmed(row["audio"], cfg)
    return dict(_measured(row, text, ids, y, cfg), mel=audio.log_mel(y, cfg.audio.sample_rate, cfg.mel))


def as_rejection(clip_id: str, e: ClipRejected) -> dict:
    return reject(clip_id, e.reason, e.detail)


def split_of(clip_id: str, val_fraction: float, salt: str) -> str:
    """Deterministic: the same id lands in the same split on every run and every worker."""
    h = hashlib.sha256(f"{salt}:{clip_id}".encode("utf-8")).digest()
    return "val" if int.from_bytes(h[:8], "big") / 2.0 ** 64 < val_fraction else "train"


def filter_rejection(clip: dict, cutoffs: Cutoffs) -> dict | None:
    """The percentile filter's rule (`Cutoffs.reason`): None if it keeps the clip, else the clip's
    rejected.jsonl entry (a clip is dropped, never truncated)."""
    reason = cutoffs.reason(clip["text_len"], clip["mel_frames"], clip["duration_ms"])
    if reason is None:
        return None
    detail = (f"text_len={clip['text_len']} mel_frames={clip['mel_frames']} duration_ms={clip['duration_ms']}; "
              f"kept: duration_ms>={cutoffs.min_duration_ms}, "
              f"{cutoffs.min_mel_frames}<=mel_frames<={cutoffs.max_mel_frames}, text_len<={cutoffs.max_text_len}")
    return reject(clip["id"], reason, detail)
