"""Per-clip work, the pure functions the job's DoFns call: measure a clip (stages 2-3).

`featurize` reads, decodes, resamples and trims a clip once and computes its lengths, its log-mel and
the features the config asks for (pitch, energy, audio; durations from a TextGrid) in the same pass,
and its quality measures (`clip["quality"]`, `melshards.preprocess.clip.quality.MEASURES`) and
`clip["audio_hash"]`, which travel with the clip to the filter stage;
the job carries them across the statistics barrier (`melshards.preprocess.out_dir.batch_files`) instead of decoding
the clip a second time. `measure_lengths` is the text and lengths alone, for tools that need no mel.
The filter's rule on a measured clip is `melshards.preprocess.stats.filter_rule.filter_rejection`.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPICallError

from melshards.preprocess.clip import alignments, audio, cache, features, quality
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs import packed_clips
from melshards.preprocess.inputs.merge import as_given
from melshards.preprocess.inputs.rows import reject
from melshards.shards_schema.text import TextRejected, check_texts
from melshards.shards_schema.vocab import tokens

# `analyse_audio`'s key for the kept samples in a run with extractors (no record feature's name)
SAMPLES = "~samples"


class ClipRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# What reading a clip's file raises when it cannot be read: OSError (a local file; Beam's BeamIOError is
# one) and the GCS client's errors, which Beam's GcsIO lets through (NotFound for a missing object,
# Forbidden, ...). Each is the clip's rejection (`_unreadable`), never the job's end.
READ_ERRORS = (OSError, GoogleAPICallError)


def _unreadable(path: str, e: BaseException) -> ClipRejected:
    """The rejection of a clip whose file `path` could not be read (`e`): missing_audio where no file is
    there, else unreadable_audio (so is a file whose existence cannot be asked either)."""
    try:
        missing = not FileSystems.exists(path)
    except READ_ERRORS:
        missing = False
    if missing:
        return ClipRejected("missing_audio", f"{path} does not exist")
    return ClipRejected("unreadable_audio", f"{path}: {e}")


def _read_bytes(path: str | None) -> bytes:
    if path is None:
        raise ClipRejected("missing_audio", "no audio file for this id")
    try:
        with FileSystems.open(path) as f:
            return f.read()
    except READ_ERRORS as e:
        raise _unreadable(path, e) from e


def _decode(path: str | None, cfg: PreprocessConfig, locator: dict | None) -> np.ndarray:
    """The clip's samples: a whole file, a member of a tar or a row of a parquet file (its bytes,
    decoded from memory), or a segment of a recording (its span only, the recording held for the
    batch's next segments: `packed_clips.recording`)."""
    if locator and "start" in locator:
        if path is None:
            raise ClipRejected("missing_audio", "no audio file for this id")
        try:
            f = packed_clips.recording(path, locator["start"], locator["end"])
            return audio.decode_span(f, cfg.audio.sample_rate, locator["start"], locator["end"])[0]
        except audio.SegmentOutOfRange as e:
            raise ClipRejected("bad_segment", f"{path}: {e}") from e
        except READ_ERRORS as e:
            raise _unreadable(path, e) from e
    if locator and path is not None:
        try:
            data = packed_clips.clip_bytes(path, locator)
        except packed_clips.NoAudio as e:
            raise ClipRejected("missing_audio", f"{path} {packed_clips.locator_key(locator)}: {e}") from e
        except READ_ERRORS as e:
            raise ClipRejected("unreadable_audio", f"{path} {packed_clips.locator_key(locator)}: {e}") from e
        return audio.decode_audio(data, cfg.audio.sample_rate)[0]
    return audio.decode_audio(_read_bytes(path), cfg.audio.sample_rate)[0]


def load_decoded(path: str | None, cfg: PreprocessConfig, locator: dict | None = None) -> np.ndarray:
    """Decode, downmix, remove the DC offset, resample, reject silence (untrimmed). Raises ClipRejected
    with the reason. `locator`: where in `path` the clip is (`melshards.preprocess.inputs.packed_clips`)."""
    try:
        y = _decode(path, cfg, locator)
    except audio.InvalidSamples as e:
        raise ClipRejected("invalid_samples", f"{path}: {e}") from e
    except audio.AudioError as e:
        raise ClipRejected("unreadable_audio", f"{path}: {e}") from e
    peak = quality.peak_dbfs(y)  # of the samples less their DC offset: a constant is not sound
    if math.isnan(peak):
        raise ClipRejected(
            "silent_audio", "no signal: every sample has the same value (digital silence or a constant DC offset)"
        )
    if peak < cfg.audio.silence_peak_dbfs:
        raise ClipRejected(
            "silent_audio", f"peak {peak:.1f} dBFS (DC offset removed) < {cfg.audio.silence_peak_dbfs} dBFS"
        )
    return y


def trim_span(y: np.ndarray, cfg: PreprocessConfig) -> tuple[int, int]:
    """[start, end) of the samples kept: when trimming, the non-silent span (`audio.trim_method`: the
    energy rule, or WebRTC's voice activity detector), else all; ClipRejected if empty."""
    a = cfg.audio
    if not a.trim_silence:
        start, end = 0, y.size
    elif a.trim_method == "webrtcvad":
        start, end = audio.vad_span(y, a.sample_rate, a.vad_aggressiveness)
    else:
        start, end = audio.nonsilent_span(y, a.trim_top_db)
    if end <= start:
        raise ClipRejected("silent_audio", "nothing left after trimming silence")
    return start, end


def load_trimmed(path: str | None, cfg: PreprocessConfig, locator: dict | None = None) -> np.ndarray:
    """Decode, downmix, remove the DC offset, resample, reject silence, trim. Raises ClipRejected with
    the reason."""
    y = load_decoded(path, cfg, locator)
    start, end = trim_span(y, cfg)
    return y[start:end]


def prepare_texts(rows: list[dict], cfg: PreprocessConfig) -> list[str | ClipRejected | None]:
    """Raw transcripts -> the symbols of each row's language's front end (`cfg.text`), or ClipRejected
    with the front end's reason (empty_text, unusable_text, unsupported_language). One front-end call
    per language of the batch: the phoneme front end costs less per row in batches. In a run with
    alignments the text is the TextGrids' phones (`featurize`): None for every row."""
    if cfg.alignments.dir:
        return [None] * len(rows)
    out: list[str | ClipRejected | None] = [""] * len(rows)
    by_language: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_language.setdefault(row["language"], []).append(i)
    for language, idx in by_language.items():
        texts = check_texts([rows[i]["text"] for i in idx], language, cfg.text.frontend_for(language))
        for i, text in zip(idx, texts):
            out[i] = ClipRejected(text.reason, text.detail) if isinstance(text, TextRejected) else text
    return out


def _measured(row: dict, text: str, samples: int, cfg: PreprocessConfig) -> dict:
    # text_len counts symbols: the ids are given once the corpus's vocabulary is known (tables.py)
    return dict(
        row,
        text=text,
        text_len=len(tokens(text, cfg.text_unit)),
        num_samples=int(samples),
        mel_frames=audio.num_frames(samples, cfg.mel.hop_length),
        duration_ms=int(round(1000 * samples / cfg.audio.sample_rate)),
    )


def _text(row: dict, text: str | ClipRejected | None, cfg: PreprocessConfig) -> str:
    text = prepare_texts([row], cfg)[0] if text is None else text
    if isinstance(text, ClipRejected):
        raise text
    return text  # type: ignore[return-value]  # prepare_texts gives None only in a run with alignments, which never calls _text


def measure_lengths(row: dict, cfg: PreprocessConfig, text: str | ClipRejected | None = None) -> dict:
    """Row -> row + normalised text and the three lengths the statistics are made of. `text`: the
    row's `prepare_texts` result when the caller made it for a batch."""
    return featurize(row, cfg, text, arrays=False)[0]


def read_alignment(row: dict, cfg: PreprocessConfig) -> alignments.Alignment:
    """The clip's TextGrid, found by the id and speaker its input gives (`merge.as_given`: as the
    aligner saw them), parsed; ClipRejected missing_alignment / alignment_mismatch (unreadable)."""
    clip_id, speaker = as_given(row)
    path = alignments.textgrid_path(cfg.alignments.dir, clip_id, speaker)  # type: ignore[arg-type]  # called only in a run with alignments.dir
    if path is None:
        raise ClipRejected(
            "missing_alignment", f"no {clip_id}.TextGrid in {cfg.alignments.dir} (nor in its {speaker!r} folder)"
        )
    try:
        with FileSystems.open(path) as f:
            return alignments.read_phones(f.read(), path)
    except alignments.AlignmentError as e:
        raise ClipRejected("alignment_mismatch", f"{path}: {e}") from e


def analyse_audio(
    path: str | None,
    cfg: PreprocessConfig,
    arrays: bool = True,
    locator: dict | None = None,
    parts: Collection[str] | None = None,
) -> tuple[dict, dict]:
    """A clip's audio -> (its span {"samples": decoded, "start": first kept, "length": kept, "audio_hash":
    the decoded samples' `quality.audio_hash`, "quality": the `quality.AUDIO_MEASURES` the run measures
    (`quality.measures`, loudness_lufs with `quality.loudness`, and dnsmos_ovrl with `quality.dnsmos`)},
    the features of the kept samples): `mel` [frames, n_mels] float32 and, as `cfg` asks, `pitch`,
    `energy` [frames] float32 and `audio` [frames * hop] int16, from one decode and one STFT (the
    project's one mel, pitch and energy computation), after the loudness normalisation when
    `audio.loudness_target_lufs` asks for it; in a run with extractors, the kept samples (float32)
    under `SAMPLES`, which the caller takes out. `arrays=False`: the span alone (no STFT: bandwidth
    NaN). `locator`: where in `path` the clip is (a parquet row, a tar member, a segment).

    `parts`: only the feature cache's parts of these names (`cache.part_names`; default: all of the
    run's), so a part the cache holds is not computed again; the span is always measured."""
    todo = set(cache.part_names(cfg) if parts is None else parts)
    extract = any(cache.is_extractor_part(p) for p in todo)
    y = load_decoded(path, cfg, locator)
    start, end = trim_span(y, cfg)
    trimmed, hop, sr = y[start:end], cfg.mel.hop_length, cfg.audio.sample_rate
    span = {
        "samples": int(y.size),
        "start": int(start),
        "length": int(end - start),
        "audio_hash": quality.audio_hash(y),
    }
    mag = audio.magnitude(trimmed, cfg.mel) if arrays and todo & {cache.MEL, cache.ENERGY, cache.MEASURES} else None
    measured: dict[str, float] = {}
    if todo & {cache.MEASURES, cache.LOUDNESS}:
        loudness = cache.LOUDNESS in todo
        values = quality.audio_quality(
            y, start, end, sr, mag if cache.MEASURES in todo else None, cfg.mel.n_fft, cfg.audio.trim_top_db, loudness
        )
        measured.update(
            {m: values[m] for p in (cache.MEASURES, cache.LOUDNESS) if p in todo for m in cache.PART_MEASURES[p]}
        )
    if cache.DNSMOS in todo:
        measured["dnsmos_ovrl"] = quality.dnsmos_ovrl(trimmed, sr)
    span["quality"] = measured
    out: dict = {}
    if not arrays:
        return span, out
    target = cfg.audio.loudness_target_lufs
    if target is not None and (extract or todo & {cache.MEL, cache.ENERGY, cache.PITCH, cache.AUDIO}):
        # measured as decoded, then scaled: the features are the normalised audio's
        gain = quality.loudness_gain(trimmed, sr, target)
        trimmed = (trimmed * gain).astype(np.float32)
        mag = None if mag is None else mag * np.float32(gain)  # the STFT is linear
    if extract:  # for the extractors (`melshards.preprocess.clip.extractor_plugins`), which the caller runs on batches
        out[SAMPLES] = trimmed
    frames = audio.num_frames(trimmed.size, hop)
    if cache.MEL in todo:
        out["mel"] = audio.log_mel_of(mag, sr, cfg.mel)  # type: ignore[arg-type]  # computed above for the mel
    if cache.ENERGY in todo:
        out["energy"] = audio.energy_of(mag)  # type: ignore[arg-type]  # and for the energy
    if cache.PITCH in todo:
        out["pitch"] = features.pitch(trimmed, sr, hop, frames, cfg.pitch)
    if cache.AUDIO in todo:
        out["audio"] = features.audio_int16(trimmed, frames, hop)
    return span, out


def featurize(
    row: dict, cfg: PreprocessConfig, text: str | ClipRejected | None = None, arrays: bool = True
) -> tuple[dict, dict]:
    """Row -> (measured clip, its features): `analyse_audio`'s, plus `durations` [phones] int32 in a run
    with alignments, whose text is then the TextGrid's phones. `arrays=False`: the lengths alone."""
    clip, out, _ = featurize_span(row, cfg, text, arrays)
    return clip, out


def featurize_span(
    row: dict,
    cfg: PreprocessConfig,
    text: str | ClipRejected | None = None,
    arrays: bool = True,
    analysed: tuple[dict, dict] | None = None,
    parts: Collection[str] | None = None,
) -> tuple[dict, dict, dict]:
    """`featurize`, and the audio's span; `analysed`: the span and audio features already known (the
    feature cache's), so the audio is not decoded; `parts`: the feature cache's parts to compute
    besides (`analyse_audio`, from one decode; default: none with `analysed`, every one without),
    their measures and arrays added to those known. The checks keep their order either way: the
    alignment, the text, then the audio."""
    aligned = read_alignment(row, cfg) if cfg.alignments.dir else None
    if aligned is None:
        text = _text(row, text, cfg)
    span, known = analysed if analysed is not None else ({}, {})
    out = dict(known)
    if analysed is None or parts:
        new_span, new_out = analyse_audio(row["audio"], cfg, arrays, row.get("locator"), parts)
        span = {**span, **new_span, "quality": {**span.get("quality", {}), **new_span["quality"]}}
        out.update(new_out)
    if aligned is not None:
        sr = cfg.audio.sample_rate
        problem = alignments.mismatch(aligned, span["samples"], sr, cfg.alignments.tolerance_ms)
        if problem:
            raise ClipRejected("alignment_mismatch", problem)
        phones, out["durations"] = alignments.phone_durations(
            aligned, span["start"], span["length"], sr, cfg.mel.hop_length
        )
        text = " ".join(phones)
    clip = _measured(row, text, span["length"], cfg)  # type: ignore[arg-type]  # a str on both paths: _text's, or the TextGrid's phones
    clip["audio_hash"] = span["audio_hash"]
    clip["quality"] = (
        quality.measure_quality(
            span["quality"],
            row["text"],
            clip["text_len"],
            span["length"] / cfg.audio.sample_rate,
            row["language"],
            row.get("asr_text"),
        )
        if cfg.quality.measures
        else {m: quality.NAN for m in quality.MEASURES}
        | {k: v for k, v in span["quality"].items() if k not in quality.MEASURES}
    )
    return clip, out, span


def as_rejection(clip_id: str, e: ClipRejected) -> dict:
    return reject(clip_id, e.reason, e.detail)
