"""Preprocessing config: every default in one place. Loaded from configs/*.yaml; unknown keys are errors."""
from __future__ import annotations

import dataclasses
from typing import Union

from shards_schema.buckets import AUTO
from shards_schema.config import ConfigError, load_yaml


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
        problems = []
        if self.mel.win_length > self.mel.n_fft:
            problems.append(f"mel.win_length {self.mel.win_length} > mel.n_fft {self.mel.n_fft}")
        if self.mel.fmax > self.audio.sample_rate / 2:
            problems.append(f"mel.fmax {self.mel.fmax} is above Nyquist ({self.audio.sample_rate / 2})")
        f = self.filter
        if not 0 <= f.mel_frames_lower_percentile < f.mel_frames_upper_percentile <= 100:
            problems.append("need 0 <= filter.mel_frames_lower_percentile < mel_frames_upper_percentile <= 100")
        if not 0 < f.text_len_upper_percentile <= 100:
            problems.append("filter.text_len_upper_percentile must be in (0, 100]")
        if not 0 <= self.split.val_fraction < 1:
            problems.append("split.val_fraction must be in [0, 1)")
        if self.pad.multiple < 1:
            problems.append("pad.multiple must be >= 1")
        problems += _bucket_problems(self.pad)
        if self.write.target_shard_mb <= 0:
            problems.append("write.target_shard_mb must be > 0")
        if problems:
            raise ConfigError("invalid preprocess config: " + "; ".join(problems))
        return self


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _bucket_problems(pad: PadConfig) -> list[str]:
    out = []
    if not (pad.buckets == AUTO or _is_int(pad.buckets) and 1 <= pad.buckets <= MAX_BUCKETS):
        out.append(f"pad.buckets must be an integer 1..{MAX_BUCKETS} or {AUTO!r}, got {pad.buckets!r}")
    if not 1 <= pad.max_buckets <= MAX_BUCKETS:
        out.append(f"pad.max_buckets must be in 1..{MAX_BUCKETS}, got {pad.max_buckets}")
    if not 0.0 <= pad.target_padding < 1.0:
        out.append(f"pad.target_padding must be in [0, 1), got {pad.target_padding}")
    if pad.min_bucket_records < 1:
        out.append(f"pad.min_bucket_records must be >= 1 (your training batch size), got {pad.min_bucket_records}")
    return out


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
    return cfg.validate()
