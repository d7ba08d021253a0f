"""Stage 6, a kept clip padded to its bucket's shapes and encoded as one record (the contract's
`melshards.shards_schema.records.encode_example`); `filter_and_write.FilterAndWrite` writes the bytes."""

from __future__ import annotations

import numpy as np

from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.stats import bucketing
from melshards.preprocess.write.report import mel_params
from melshards.shards_schema import Schema, Vocabulary
from melshards.shards_schema.extracted import ExtractorOutput
from melshards.shards_schema.records import encode_example
from melshards.shards_schema.vocab import text_ids


def pad_to(x: np.ndarray, length: int, value) -> np.ndarray:
    """Pad axis 0 to `length` with `value`; longer input is a bug (the filter guarantees it fits)."""
    if len(x) > length:
        raise ValueError(f"cannot pad {len(x)} to {length}: the filter should have dropped this clip")
    out = np.empty((length,) + x.shape[1:], x.dtype)  # what np.pad gives, without its per-call setup
    out[: len(x)] = x
    out[len(x) :] = value
    return out


def encode_clip(
    clip: dict,
    arrays: dict,
    buckets: dict,
    text_hists: dict,
    corpus_tables: dict,
    vocab: Vocabulary,
    cfg: PreprocessConfig,
    outputs: tuple[ExtractorOutput, ...] = (),
) -> tuple[str, int, bytes]:
    """Clip and its unpadded features (`clips.featurize`'s arrays: mel, and pitch, energy, audio,
    durations as the run computes them) -> (split, bucket, Example bytes) padded to its bucket's shapes;
    the speaker and language ids from `corpus_tables` (`melshards.preprocess.stats.tables`).

    Padding: the mel with log(floor) (digital silence), pitch, energy, audio and durations with 0; the
    extractors' `outputs` (from `arrays`) as each declares (`ExtractorOutput.padded`); a reference
    (`reference_id`, `reference_mel`, `reference_len` in `arrays`) comes cut and padded."""
    b = bucketing.bucket_of(clip, buckets)
    mel_frames = buckets["bounds"][b]
    text_len = bucketing.text_len_of(text_hists, b, cfg.pad.multiple)
    hop = cfg.mel.hop_length
    sr = cfg.audio.sample_rate
    features = Schema.feature_table(
        text_len,
        mel_frames,
        cfg.mel.n_mels,
        cfg.optional_features,
        hop,
        extracted=outputs,
        sample_rate=sr,
        reference_frames=cfg.reference.frames,
    )
    mel = arrays["mel"]
    values = {
        "id": clip["id"],
        "speaker": clip["speaker"],
        "text": clip["text"],
        "speaker_id": corpus_tables["speakers"][clip["speaker"]]["id"],
        "language": clip["language"],
        "language_id": corpus_tables["languages"][clip["language"]]["id"],
        "text_ids": pad_to(np.asarray(text_ids(clip["text"], vocab), np.int32), text_len, 0),
        "text_len": clip["text_len"],
        "mel": pad_to(mel, mel_frames, mel_params(cfg.mel).pad_value),
        "mel_len": mel.shape[0],
    }
    for name in ("pitch", "energy", "durations"):
        if name in arrays:
            values[name] = pad_to(arrays[name], text_len if name == "durations" else mel_frames, 0)
    if "audio" in arrays:
        values["audio"] = pad_to(arrays["audio"], mel_frames * hop, 0)
        values["audio_len"] = clip["num_samples"]
    for o in outputs:
        values.update(o.padded(arrays[o.name], mel_frames, hop, sr))
    # other_clip references (`melshards.preprocess.write.other_clip_references`), already cut
    if "reference_mel" in arrays:
        values.update({k: arrays[k] for k in ("reference_id", "reference_mel", "reference_len", "reference_start")})
    return clip["split"], b, encode_example(features, values)
