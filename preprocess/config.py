"""Preprocessing config: every default in one place. Loaded from configs/*.yaml; unknown keys are errors."""
from __future__ import annotations

import dataclasses
import math
from typing import Union

from melshards.shards_schema.buckets import AUTO
from melshards.shards_schema.config import ConfigError, load_yaml


@dataclasses.dataclass(frozen=True)
class AudioConfig:
    sample_rate: int = 22050
    trim_silence: bool = True
    trim_top_db: float = 40.0  # librosa.effects.trim: below peak - top_db counts as silence
    silence_peak_dbfs: float = -50.0  # a clip whose peak is below this is rejected as silent


@dataclasses.dataclass(frozen=True)
class MelConfig:
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-5  # log(max(mel, floor)); padding uses log(floor)
    power: float = 1.0  # 1: magnitude mel (Tacotron 2 convention), 2: power


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    min_duration_s: float = 0.5  # after trimming; shorter clips are rejected as too_short
    mel_frames_lower_percentile: float = 0.5
    mel_frames_upper_percentile: float = 99.0
    text_len_upper_percentile: float = 99.0


MAX_BUCKETS = 99  # shard names carry the bucket as two digits (bNN)


@dataclasses.dataclass(frozen=True)
class PadConfig:
    multiple: int = 8  # padded lengths are rounded up to this (keeps reduction factors 1,2,4,8 exact)
    # Length buckets (docs/preprocess.md): K static shapes whose bounds minimise the padded mel frames.
    buckets: Union[int, str] = AUTO  # K >= 1, or "auto": the fewest <= max_buckets reaching target_padding
    max_buckets: int = 8  # auto never uses more (each bucket is one compiled shape in the trainer)
    target_padding: float = 0.10  # auto stops adding buckets once mel padding is at most this share
    # Set to your training batch size: the trainer drops incomplete batches, so a bucket with fewer
    # training records would never be trained on. Smaller buckets are merged (stats.json says which).
    min_bucket_records: int = 32


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    val_fraction: float = 0.05
    salt: str = "melshards"  # changes which clips land in val without changing the fraction


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    target_shard_mb: float = 150.0  # shards hold about this many MB (100-200 MB reads well from GCS)


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    audio: AudioConfig = AudioConfig()
    mel: MelConfig = MelConfig()
    filter: FilterConfig = FilterConfig()
    pad: PadConfig = PadConfig()
    split: SplitConfig = SplitConfig()
    write: WriteConfig = WriteConfig()

    def validate(self) -> "PreprocessConfig":
        """Range-check every numeric field (RANGES) and pad.buckets, then the relations between fields.

        Relations are checked only when every field is in range, so a bad value is reported as itself
        (a negative sample rate, not an fmax above Nyquist).
        """
        problems = [p for key, rng in RANGES.items() if (p := rng.check(key, _get(self, key)))]
        problems += _buckets_problem(self.pad.buckets)
        if not problems:
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
            problems.append(f"mel.fmax {m.fmax} is above Nyquist ({self.audio.sample_rate / 2}, half of "
                            "audio.sample_rate)")
        if f.mel_frames_lower_percentile >= f.mel_frames_upper_percentile:
            problems.append(f"filter.mel_frames_lower_percentile {f.mel_frames_lower_percentile} must be below "
                            f"filter.mel_frames_upper_percentile {f.mel_frames_upper_percentile}")
        return problems


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of one numeric config value; None = unbounded on that side. Floats must be finite."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: the value must be > low, not >= low
    high_open: bool = False

    def text(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join(parts)

    def check(self, key: str, value) -> str | None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return f"{key} is {value!r}, must be a finite number {self.text()}"
        ok = True
        if self.low is not None:
            ok = value > self.low if self.low_open else value >= self.low
        if ok and self.high is not None:
            ok = value < self.high if self.high_open else value <= self.high
        return None if ok else f"{key} is {value!r}, must be {self.text()}"


POSITIVE = Range(low=0, low_open=True)
PERCENTILE = Range(low=0, high=100)

# Every int/float field of PreprocessConfig, with its valid range (a test checks none is missing).
RANGES: dict[str, Range] = {
    "audio.sample_rate": POSITIVE,
    "audio.trim_top_db": POSITIVE,
    "audio.silence_peak_dbfs": Range(high=0),  # dBFS: 0 is full scale
    "mel.n_fft": POSITIVE,
    "mel.hop_length": POSITIVE,
    "mel.win_length": POSITIVE,
    "mel.n_mels": POSITIVE,
    "mel.fmin": Range(low=0),
    "mel.fmax": POSITIVE,
    "mel.log_floor": POSITIVE,
    "mel.power": POSITIVE,
    "filter.min_duration_s": Range(low=0),
    "filter.mel_frames_lower_percentile": PERCENTILE,
    "filter.mel_frames_upper_percentile": PERCENTILE,
    "filter.text_len_upper_percentile": Range(low=0, high=100, low_open=True),
    "pad.multiple": Range(low=1),
    "pad.max_buckets": Range(low=1, high=MAX_BUCKETS),
    "pad.target_padding": Range(low=0, high=1, high_open=True),
    "pad.min_bucket_records": Range(low=1),  # your training batch size
    "split.val_fraction": Range(low=0, high=1, high_open=True),
    "write.target_shard_mb": POSITIVE,
}


def _get(cfg: PreprocessConfig, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _buckets_problem(buckets) -> list[str]:
    """pad.buckets is an int or "auto", so it is checked here rather than in RANGES."""
    if buckets == AUTO or _is_int(buckets) and 1 <= buckets <= MAX_BUCKETS:
        return []
    return [f"pad.buckets is {buckets!r}, must be an integer >= 1 and <= {MAX_BUCKETS}, or {AUTO!r}"]


def parse_buckets(value: str) -> Union[int, str]:
    """`--buckets K|auto` -> the pad.buckets value (range checked by validate)."""
    if value == AUTO:
        return AUTO
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--buckets must be an integer >= 1 or {AUTO!r}, got {value!r}") from None


def load_config(path: str | None, buckets: str | None = None) -> PreprocessConfig:
    """The config file (or the defaults), `--buckets` overriding pad.buckets, validated."""
    cfg = PreprocessConfig() if path is None else load_yaml(PreprocessConfig, path)
    if buckets is not None:
        cfg = dataclasses.replace(cfg, pad=dataclasses.replace(cfg.pad, buckets=parse_buckets(buckets)))
    try:
        return cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None
