"""Preprocessing config: every default in one place. Loaded from configs/*.yaml; unknown keys are errors."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated

from pydantic import Field, PlainValidator, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from melshards.shards_schema.buckets import AUTO
from melshards.shards_schema.config import VALUE, ConfigError, check, field_bounds, load_yaml, one_of

# Bounds are declared on the fields (pydantic checks them, with the types, in `validate`); floats must be finite.
POSITIVE = Field(gt=0)
PERCENTILE = Field(ge=0, le=100)


TRIM_METHODS = ("energy", "webrtcvad")


@dataclasses.dataclass(frozen=True)
class AudioConfig:
    sample_rate: Annotated[StrictInt, POSITIVE] = 22050
    trim_silence: StrictBool = True
    trim_top_db: Annotated[StrictFloat, POSITIVE] = 40.0  # librosa.effects.trim: below peak - top_db counts as silence
    silence_peak_dbfs: Annotated[
        StrictFloat, Field(le=0)
    ] = -50.0  # dBFS, 0 is full scale: a clip whose peak is below this is rejected as silent
    # How the silence is trimmed: "energy" (frames within trim_top_db of the loudest) or "webrtcvad" (the
    # first to the last frame WebRTC's voice activity detector calls speech; docs/preprocess.md)
    trim_method: Annotated[StrictStr, one_of(*TRIM_METHODS)] = "energy"
    vad_aggressiveness: Annotated[StrictInt, Field(ge=0, le=3)] = 2  # webrtcvad's mode: 3 calls the least speech
    # Loudness normalisation (off: None): each clip's samples scaled to this integrated loudness (BS.1770,
    # LUFS) before the mel; recorded in schema.json. The quality measures describe the audio as decoded.
    loudness_target_lufs: Annotated[StrictFloat, Field(ge=-70, le=0)] | None = None


@dataclasses.dataclass(frozen=True)
class MelConfig:
    n_fft: Annotated[StrictInt, POSITIVE] = 1024
    hop_length: Annotated[StrictInt, POSITIVE] = 256
    win_length: Annotated[StrictInt, POSITIVE] = 1024
    n_mels: Annotated[StrictInt, POSITIVE] = 80
    fmin: Annotated[StrictFloat, Field(ge=0)] = 0.0
    fmax: Annotated[StrictFloat, POSITIVE] = 8000.0
    log_floor: Annotated[StrictFloat, POSITIVE] = 1e-5  # log(max(mel, floor)); padding uses log(floor)
    power: Annotated[StrictFloat, POSITIVE] = 1.0  # 1: magnitude mel (Tacotron 2 convention), 2: power


@dataclasses.dataclass(frozen=True)
class QualityRulesConfig:
    """The filter rules on the quality measures (`melshards.preprocess.stats.quality_rules`; docs/preprocess.md,
    Quality rules). A bound set to null turns its rule off."""

    rate_iqr_k: Annotated[StrictFloat, Field(ge=0)] | None = (
        3.0  # speaking_rate_outlier outside Q1 - k*IQR .. Q3 + k*IQR of the speaker's rates in its language
    )
    rate_min_clips: Annotated[StrictInt, Field(ge=1)] = (
        20  # a speaker with fewer rated clips in a language: its median x the language's spread; a language with fewer: none
    )
    max_clipped_fraction: Annotated[StrictFloat, Field(ge=0, le=1)] | None = (
        0.001  # clipped: a larger share of samples at >= 0.99 of full scale
    )
    min_bandwidth_share: Annotated[StrictFloat, Field(ge=0, le=1)] | None = (
        0.5  # narrowband: energy ends below this share of the output's Nyquist (8 kHz-through audio: 0.36)
    )
    min_snr_db: StrictFloat | None = 15.0  # noisy: a lower SNR estimate (quality.snr_db)
    max_pause_s: Annotated[StrictFloat, POSITIVE] | None = 1.0  # long_pause: a longer pause inside the speech
    max_cer: Annotated[StrictFloat, Field(ge=0)] | None = (
        0.5  # transcript_mismatch: a larger CER of text against asr_text (only where the manifest has asr_text)
    )
    max_asr_repeat: Annotated[StrictFloat, Field(ge=0)] | None = None  # asr_repeat: more repeats (off)
    max_foreign_script_fraction: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None  # foreign_script (off)
    duplicates: StrictBool = (
        True  # duplicate_audio: one recording (audio_hash) under two ids keeps the first that passes the rest
    )


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    min_duration_s: Annotated[StrictFloat, Field(ge=0)] = 0.5  # after trimming; shorter clips are rejected as too_short
    mel_frames_lower_percentile: Annotated[StrictFloat, PERCENTILE] = 0.5
    mel_frames_upper_percentile: Annotated[StrictFloat, PERCENTILE] = 99.0
    text_len_upper_percentile: Annotated[StrictFloat, Field(gt=0, le=100)] = (
        99.0  # per language: a symbol means different things in each
    )
    min_speaker_clips: Annotated[StrictInt, Field(ge=1)] = (
        1  # a speaker with fewer measured clips is dropped (speaker_too_few_clips)
    )


MAX_BUCKETS = 99  # shard names carry the bucket as two digits (bNN)


def buckets_ok(value) -> bool:
    """The rule of pad.buckets (and --buckets): an int K in 1..MAX_BUCKETS, or "auto"."""
    return value == AUTO or isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_BUCKETS


def _check_buckets(value):
    """pad.buckets, checked by `buckets_ok`."""
    if buckets_ok(value):
        return value
    raise PydanticCustomError(
        VALUE, "must be an integer >= 1 and <= {high}, or {auto}", {"high": MAX_BUCKETS, "auto": repr(AUTO)}
    )


@dataclasses.dataclass(frozen=True)
class PadConfig:
    multiple: Annotated[StrictInt, Field(ge=1)] = (
        8  # padded lengths are rounded up to this (keeps reduction factors 1,2,4,8 exact)
    )
    # Length buckets (docs/preprocess.md): K static shapes whose bounds minimise the padded mel frames.
    buckets: Annotated[int | str, PlainValidator(_check_buckets)] = (
        AUTO  # K >= 1, or "auto": the fewest <= max_buckets reaching target_padding
    )
    max_buckets: Annotated[StrictInt, Field(ge=1, le=MAX_BUCKETS)] = (
        8  # auto never uses more (each bucket is one compiled shape in the trainer)
    )
    target_padding: Annotated[StrictFloat, Field(ge=0, lt=1)] = (
        0.10  # auto stops adding buckets once mel padding is at most this share
    )
    # Set to your training batch size: the trainer drops incomplete batches, so a bucket with fewer
    # training records would never be trained on. Smaller buckets are merged (stats.json says which).
    min_bucket_records: Annotated[StrictInt, Field(ge=1)] = 32


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    val_fraction: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.05
    salt: StrictStr = "melshards"  # changes which clips land in val without changing the fraction
    # Whole speakers held out in val (unseen-speaker evaluation); the others' val clips are drawn within
    # each speaker: round(val_fraction * clips) of them, so a speaker of >= 0.5 / val_fraction clips has some.
    val_speakers: tuple[StrictStr, ...] = ()


FRONTEND_NAMES = ("characters", "phonemes", "english")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The text front end of each language (docs/preprocess.md): `languages` maps a code (`en`, `zh-CN`)
    or its primary subtag (`zh`) to a front end; every other language gets `default`."""

    default: Annotated[StrictStr, one_of(*FRONTEND_NAMES)] = "characters"
    languages: dict[StrictStr, Annotated[StrictStr, one_of(*FRONTEND_NAMES)]] = dataclasses.field(
        default_factory=lambda: {"en": "english"}
    )

    def frontend_for(self, language: str) -> str:
        """The front end's name for a language code: the code itself, then its primary subtag, then
        default; codes compared as BCP 47 compares them (case, and `_` for `-`, ignored)."""

        def fold(code: str) -> str:
            return code.strip().replace("_", "-").lower()

        languages = {fold(k): v for k, v in self.languages.items()}
        for key in (fold(language), fold(language).split("-")[0]):
            if key in languages:
                return languages[key]
        return self.default


@dataclasses.dataclass(frozen=True)
class FeaturesConfig:
    """What a record holds besides text and log-mel (docs/preprocess.md, Features). Each is computed in the
    one pass, from the one decode, on the mel's frames."""

    pitch: StrictBool = False  # f0 in Hz per mel frame, 0 where unvoiced (`pitch:` chooses the tracker and range)
    energy: StrictBool = False  # per mel frame: the L2 norm of the magnitude STFT frame the mel is made from
    audio: StrictBool = False  # the trimmed waveform, int16, sample i * mel.hop_length at the centre of mel frame i


@dataclasses.dataclass(frozen=True)
class QualityConfig:
    """The quality measures of every clip (`melshards.preprocess.clip.quality`; docs/preprocess.md, Quality
    measures), computed in the measure stage from the one decode and the mel's STFT."""

    measures: StrictBool = True  # off: every measure NaN (the audio hash is still taken)
    # BS.1770 integrated loudness (pyloudnorm): off, loudness_lufs is NaN. Off by default: it costs more
    # than the other default measures together (docs/performance.md#quality-measures) and quiet is no
    # fault (normalise instead)
    loudness: StrictBool = False
    # DNSMOS P.835 overall (speechmos' ONNX model): off by default, it costs far more than all of a clip's
    # other work (docs/performance.md#quality-measures)
    dnsmos: StrictBool = False


PITCH_TRACKERS = ("dio", "pyin")


@dataclasses.dataclass(frozen=True)
class PitchConfig:
    tracker: Annotated[StrictStr, one_of(*PITCH_TRACKERS)] = (
        "dio"  # WORLD dio + stonemask; pyin: librosa (docs/performance.md compares them)
    )
    fmin: Annotated[StrictFloat, POSITIVE] = 65.0  # Hz: the lowest f0 searched for
    fmax: Annotated[StrictFloat, POSITIVE] = 800.0  # Hz: the highest


@dataclasses.dataclass(frozen=True)
class AlignmentsConfig:
    """Phone durations from Montreal Forced Aligner TextGrids (`--alignments DIR`, or `dir` here)."""

    dir: StrictStr | None = None  # local or gs://: DIR/ID.TextGrid or DIR/SPEAKER/ID.TextGrid; text_ids become phones
    tolerance_ms: Annotated[StrictFloat, Field(ge=0)] = (
        20.0  # a TextGrid whose end differs from the audio's by more is alignment_mismatch
    )


REFERENCE_SOURCES = ("none", "other_clip", "same_clip")


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """A reference per record for zero-shot voice models (docs/preprocess.md, References); off by default."""

    source: Annotated[StrictStr, one_of(*REFERENCE_SOURCES)] = (
        "none"  # other_clip: another kept clip of the speaker (docs/preprocess.md), stored; same_clip: cut at train time
    )
    frames: Annotated[StrictInt, POSITIVE] = 256  # the reference's fixed length in mel frames (static shape)
    min_seconds: Annotated[StrictFloat, Field(ge=0)] = 3.0  # other_clip prefers reference clips at least this long
    seed: Annotated[StrictInt, Field(ge=0)] = (
        0  # which clip and which slice each record gets (same seed, same corpus: same references)
    )
    # a clip no other clip of its speaker may serve (its speaker's only clip, or only training clip): "own_clip"
    # gives it a slice of itself (counted in schema.json), "reject" rejects it (rejected.jsonl, no_reference_clip)
    single_clip: Annotated[StrictStr, one_of("own_clip", "reject")] = "own_clip"


@dataclasses.dataclass(frozen=True)
class ExtractorConfig:
    """One per-clip extractor (docs/preprocess.md, Extractors): `factory(**options)` returns it
    (`melshards.preprocess.clip.extractor_plugins`), loaded once per worker."""

    factory: StrictStr  # package.module:function, as `melshards train --model` names a model factory
    options: dict[StrictStr, typing.Any] = dataclasses.field(default_factory=dict)  # the factory's keyword arguments
    batch_size: Annotated[StrictInt, Field(ge=1)] = 16  # clips per call


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    target_shard_mb: Annotated[StrictFloat, POSITIVE] = (
        150.0  # shards hold about this many MB (100-200 MB reads well from GCS)
    )


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    audio: AudioConfig = AudioConfig()
    mel: MelConfig = MelConfig()
    filter: FilterConfig = FilterConfig()
    pad: PadConfig = PadConfig()
    split: SplitConfig = SplitConfig()
    text: TextConfig = TextConfig()
    features: FeaturesConfig = FeaturesConfig()
    quality: QualityConfig = QualityConfig()
    quality_rules: QualityRulesConfig = QualityRulesConfig()
    pitch: PitchConfig = PitchConfig()
    alignments: AlignmentsConfig = AlignmentsConfig()
    write: WriteConfig = WriteConfig()
    extractors: tuple[ExtractorConfig, ...] = ()
    reference: ReferenceConfig = ReferenceConfig()

    def frontend_for(self, language: str) -> str:
        """The text front end of a language's clips: the phones of their TextGrids (`alignments`, the
        name `melshards.shards_schema.text.ALIGNMENTS`) in a run with alignments, else `text`'s choice."""
        return "alignments" if self.alignments.dir else self.text.frontend_for(language)

    @property
    def text_unit(self) -> str:
        """What one text id stands for: a phone in a run with alignments, else a character."""
        return "phone" if self.alignments.dir else "character"

    @property
    def optional_features(self) -> tuple[str, ...]:
        """The optional record features (`melshards.shards_schema.schema.OPTIONAL_FEATURES`) this config adds."""
        f = self.features
        return tuple(
            name
            for name, on in (
                ("pitch", f.pitch),
                ("energy", f.energy),
                ("audio", f.audio),
                ("durations", self.alignments.dir is not None),
                ("reference", self.reference.source == "other_clip"),
            )
            if on
        )

    def validate(self) -> PreprocessConfig:
        """Check every field against its declared type and bounds (pydantic), then the relations between
        fields. Relations are checked only when every field is valid, so a bad value is reported as
        itself (a negative sample rate, not an fmax above Nyquist).
        """
        check(self, "preprocess config")
        problems = self._relations()
        if problems:
            raise ConfigError("invalid preprocess config: " + "; ".join(problems))
        return self

    def _relations(self) -> list[str]:
        problems = []
        m, f = self.mel, self.filter
        if m.win_length > m.n_fft:
            problems.append(f"mel.win_length {m.win_length} > mel.n_fft {m.n_fft}")
        if m.fmin >= m.fmax:
            problems.append(f"mel.fmin {m.fmin} must be below mel.fmax {m.fmax}")
        if m.fmax > self.audio.sample_rate / 2:
            problems.append(
                f"mel.fmax {m.fmax} is above Nyquist ({self.audio.sample_rate / 2}, half of audio.sample_rate)"
            )
        if f.mel_frames_lower_percentile >= f.mel_frames_upper_percentile:
            problems.append(
                f"filter.mel_frames_lower_percentile {f.mel_frames_lower_percentile} must be below "
                f"filter.mel_frames_upper_percentile {f.mel_frames_upper_percentile}"
            )
        if self.pitch.fmin >= self.pitch.fmax:
            problems.append(f"pitch.fmin {self.pitch.fmin} must be below pitch.fmax {self.pitch.fmax}")
        if self.pitch.fmax > self.audio.sample_rate / 2:
            problems.append(f"pitch.fmax {self.pitch.fmax} is above Nyquist ({self.audio.sample_rate / 2})")
        return problems


def _numeric_fields(cls, prefix: str = ""):
    for name, tp in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{name}.")
        elif tp in (int, float):
            yield prefix + name


# The bounds of every numeric field as declared on it (a test checks none is missing): for the docs.
RANGES: dict[str, str] = {
    key: b for key in _numeric_fields(PreprocessConfig) if (b := field_bounds(PreprocessConfig, key.split(".")))
}


def parse_buckets(value: str) -> int | str:
    """`--buckets K|auto` -> the pad.buckets value; ConfigError naming --buckets (not the config file,
    which does not hold it) for a value `buckets_ok` refuses."""
    try:
        k = value if value == AUTO else int(value)
    except ValueError:
        k = None
    if k is None or not buckets_ok(k):
        raise ConfigError(
            f"--buckets must be an integer >= 1 or {AUTO!r}, at most {MAX_BUCKETS} (shard names hold "
            f"the bucket in two digits), got {value!r}"
        )
    return k


def load_config(path: str | None, buckets: str | None = None, alignments: str | None = None) -> PreprocessConfig:
    """The config file (or the defaults), `--buckets` overriding pad.buckets and `--alignments`
    alignments.dir, validated."""
    cfg = PreprocessConfig() if path is None else load_yaml(PreprocessConfig, path)
    if buckets is not None:
        cfg = dataclasses.replace(cfg, pad=dataclasses.replace(cfg.pad, buckets=parse_buckets(buckets)))
    if alignments is not None:
        cfg = dataclasses.replace(cfg, alignments=dataclasses.replace(cfg.alignments, dir=alignments))
    try:
        return cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None
