"""The per-frame features besides the mel, as pure functions of the trimmed clip: pitch (f0) on the
mel's frames and the waveform as int16 aligned to them. Energy comes from the mel's own STFT
(`melshards.preprocess.clip.audio.energy_of`).

Frame i of every feature is the mel's frame i: centred on sample i * hop_length of the trimmed clip
(librosa's `center=True`), `audio.num_frames(len(y), hop)` frames in all. `clip_summary` is a clip's
share of the feature statistics, made where the clip is measured.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from melshards.preprocess.clip.audio import load_librosa
from melshards.preprocess.config import PitchConfig
from melshards.shards_schema.stats import Moments


def fit_frames(x: np.ndarray, frames: int) -> np.ndarray:
    """`x` cut or zero-padded at the end to `frames` values: a tracker's last frame may fall either side
    of the mel's (its frame count comes from a float duration); the frames before it coincide."""
    x = np.asarray(x[:frames], np.float32)
    return np.pad(x, (0, frames - x.size)) if x.size < frames else x


def dio_speed(sr: int, fmax: float) -> int:
    """DIO's `speed`: it searches f0 candidates in the clip decimated by this factor. Down to 5 x fmax
    samples per second (4 kHz for fmax 800: speed 5 at 22.05 kHz) the candidates are as good and DIO
    cheaper (docs/performance.md#pitch-trackers; StoneMask then refines at the full rate)."""
    return int(np.clip(sr // (5 * fmax), 1, 12))


def refine_rate(sr: int, fmax: float) -> int:
    """The sample rate StoneMask refines at: 10 x fmax (8 kHz for fmax 800), never above the clip's.
    Its cost grows with the samples, its accuracy does not need more (docs/performance.md#pitch-trackers)."""
    return int(min(sr, max(10 * fmax, 1)))


def pitch_dio(y: np.ndarray, sr: int, hop_length: int, frames: int, cfg: PitchConfig) -> np.ndarray:
    """WORLD's DIO then StoneMask (pyworld). DIO's frame k is at time k * frame_period, and
    frame_period = 1000 * hop / sr ms puts it at sample k * hop: the mel's frame k. 0 = unvoiced.
    StoneMask refines each f0 on the clip resampled to `refine_rate` (the times are in seconds)."""
    import pyworld  # imported by the workers of runs with pitch only

    x = np.ascontiguousarray(y, np.float64)
    period = 1000.0 * hop_length / sr
    f0, times = pyworld.dio(
        x, sr, f0_floor=cfg.fmin, f0_ceil=cfg.fmax, frame_period=period, speed=dio_speed(sr, cfg.fmax)
    )
    rate = refine_rate(sr, cfg.fmax)
    if rate < sr:
        x = np.ascontiguousarray(load_librosa().resample(y, orig_sr=sr, target_sr=rate, res_type="soxr_lq"), np.float64)
    return fit_frames(pyworld.stonemask(x, f0, times, rate), frames)


def pitch_pyin(y: np.ndarray, sr: int, hop_length: int, frames: int, cfg: PitchConfig) -> np.ndarray:
    """librosa's probabilistic YIN with centred frames at hop_length (the mel's frames); unvoiced
    frames (and NaN) -> 0. The frame is 2048 samples at 22.05 kHz, scaled with the rate, and long
    enough for two periods of fmin."""
    frame_length = max(2048 * sr // 22050, int(np.ceil(2 * sr / cfg.fmin)) + 2)
    frame_length = 1 << int(np.ceil(np.log2(frame_length)))
    f0, voiced, _ = load_librosa().pyin(
        y, fmin=cfg.fmin, fmax=cfg.fmax, sr=sr, frame_length=frame_length, hop_length=hop_length, center=True
    )
    return fit_frames(np.where(voiced & np.isfinite(f0), f0, 0.0), frames)


TRACKERS = {"dio": pitch_dio, "pyin": pitch_pyin}


def pitch(y: np.ndarray, sr: int, hop_length: int, frames: int, cfg: PitchConfig) -> np.ndarray:
    """f0 in Hz per mel frame of the trimmed clip `y`, float32 [frames], 0 where unvoiced, else within
    [cfg.fmin, cfg.fmax]; by `cfg.tracker`."""
    f0 = TRACKERS[cfg.tracker](y, sr, hop_length, frames, cfg)
    # StoneMask's refinement may step a little outside the range DIO searched (64.1 Hz for fmin 65):
    # voiced frames are clipped into it, so every value a record holds is 0 or within [fmin, fmax]
    voiced = np.isfinite(f0) & (f0 > 0)
    return np.where(voiced, np.clip(f0, cfg.fmin, cfg.fmax), 0.0).astype(np.float32)


def audio_int16(y: np.ndarray, frames: int, hop_length: int) -> np.ndarray:
    """The trimmed clip as int16 [frames * hop_length]: clipped to [-1, 1], times 32767, rounded, then
    zeros. Sample i * hop is the centre of mel frame i, so mel frames [a, a + k) pair with samples
    [a * hop, (a + k) * hop) (HiFi-GAN's segments); the clip's own len(y) samples come first and
    frames * hop > len(y) always (frames = 1 + len(y) // hop)."""
    out = np.zeros(frames * hop_length, np.int16)
    n = min(y.size, out.size)
    out[:n] = np.rint(np.clip(y[:n], -1.0, 1.0) * 32767.0).astype(np.int16)
    return out


VECTOR = "vector:"  # a summary's key prefix for an extractor's vector output (its sum, for the centroids)


def clip_summary(arrays: dict, vectors: tuple[str, ...] = ()) -> dict:
    """One clip's unpadded features -> {feature: Moments (dim 1)} and `pitch_hz` (Hz -> voiced frames);
    each of the extractors' `vectors` as Moments of one observation (`VECTOR` + name): what the feature
    statistics sum (`melshards.preprocess.stats.feature_stats`)."""
    out: dict = {}
    for name in vectors:
        if name in arrays:
            out[VECTOR + name] = Moments.of(np.asarray(arrays[name], np.float64)[None, :])
    if "pitch" in arrays:
        f0 = np.asarray(arrays["pitch"], np.float64)
        voiced = f0[f0 > 0]
        out["pitch"] = Moments.of(voiced[:, None]) if voiced.size else Moments.empty(1)
        out["pitch_hz"] = Counter(np.rint(voiced).astype(np.int64).tolist())
    if "energy" in arrays:
        out["energy"] = Moments.of(np.asarray(arrays["energy"], np.float64)[:, None])
    return out
