"""Audio decoding and the project's one log-mel implementation (librosa). Pure functions."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import os
import struct
import sys
import tempfile

import numpy as np
import soundfile as sf

from melshards.preprocess.config import AudioConfig, MelConfig

# The librosa modules whose numba gufuncs compile as they are imported (cache=True: to files beside them).
LIBROSA_COMPILED = ("librosa.util.utils", "librosa.core.audio", "librosa.core.pitch")


def librosa_lock_path() -> str:
    return os.path.join(tempfile.gettempdir(), "melshards-librosa-numba.lock")


def compiled_marker_path() -> str:
    """The file a locked import leaves once the modules' numba caches are written whole.

    It lives where numba writes librosa's caches (NUMBA_CACHE_DIR, else `__pycache__` beside
    librosa's sources), so it goes with them: a recreated environment at the same path has neither
    and compiles under the lock again, even where the installer hard-links librosa from its own cache
    and the new sources keep the old mtimes. Its name comes from the modules' sources (path, size,
    mtime), numba's version and the interpreter: a reinstalled librosa takes the lock again. Where
    that directory is not writable (numba then caches elsewhere) no marker is left, and every
    process imports under the lock.
    """
    from importlib import metadata, util

    stamps = [sys.executable, metadata.version("numba")]
    origins: list[str] = [util.find_spec(name).origin for name in LIBROSA_COMPILED]  # type: ignore[union-attr, misc]  # librosa's own modules: found, from files
    for origin in origins:
        st = os.stat(origin)
        stamps.append(f"{origin}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha1("\n".join(stamps).encode("utf-8")).hexdigest()[:16]
    where = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(origins[-1]), "__pycache__")
    return os.path.join(where, f"melshards-librosa-numba-{digest}.done")


def _locked(path: str) -> int | None:
    """A descriptor of `path` holding its exclusive flock (waits for it); None where there is no
    flock (Windows) or the file cannot be opened (another user's, not readable): then no lock."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@functools.cache  # once per process
def load_librosa():
    """librosa, its compiled modules imported by one process of this machine at a time until their
    numba caches are complete.

    Their gufuncs are compiled at import and cached in two files each. Two processes compiling them
    at once (two job or test workers on a fresh install) can write the two files of one gufunc
    with different ABI names, and a process then calling it segfaults (numba #10128, open). Under an
    exclusive `flock` the first process compiles and writes the cache, then leaves a marker
    (`compiled_marker_path`); the others wait, then load it. Once the marker is there, processes
    only read the caches and import at once, side by side (docs/performance.md#preprocess-start-up).
    """
    marker = compiled_marker_path()
    fd = None if os.path.exists(marker) else _locked(librosa_lock_path())
    try:
        for name in LIBROSA_COMPILED:
            importlib.import_module(name)
        if fd is not None:
            with contextlib.suppress(OSError):
                open(marker, "a").close()
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock
    return importlib.import_module("librosa")


class AudioError(ValueError):
    """The bytes are not decodable audio (unreadable, truncated, empty)."""


class InvalidSamples(AudioError):
    """The file decodes, but some samples are NaN or infinite (a float WAV/FLAC written from broken data)."""


def check_finite(y: np.ndarray) -> None:
    """Raise InvalidSamples if any sample is NaN or infinite, saying how many and where the first is.

    Checked before any arithmetic: a NaN would spread through resampling and the mel, and librosa would
    warn about it on the console instead of the clip being rejected.
    """
    bad = ~np.isfinite(y)
    if bad.any():
        frames = np.flatnonzero(bad.any(axis=-1)) if y.ndim > 1 else np.flatnonzero(bad)
        nan, inf = int(np.isnan(y).sum()), int(np.isinf(y).sum())
        raise InvalidSamples(f"{nan} NaN and {inf} infinite samples, the first at frame {int(frames[0])}")


def remove_dc(y: np.ndarray) -> np.ndarray:
    """`y` minus its mean (the DC offset), float32; the mean is accumulated in float64."""
    return (y - np.mean(y, dtype=np.float64)).astype(np.float32)


def riff_data_shortfall(data: bytes) -> int:
    """Bytes a RIFF/WAVE file's `data` chunk declares but does not hold (0 if whole or not a WAV).

    libsndfile quietly shortens a truncated WAV to what is present, so the header is checked here.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return 0
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        if chunk == b"data":
            return max(0, size - (len(data) - pos - 8)) if size != 0xFFFFFFFF else 0
        pos += 8 + size + (size & 1)
    return 0


def _syncsafe(b: bytes) -> int:
    return (b[0] & 0x7F) << 21 | (b[1] & 0x7F) << 14 | (b[2] & 0x7F) << 7 | (b[3] & 0x7F)


def mpeg_length_is_declared(data: bytes) -> bool:
    """True if an MP3's first frame carries a Xing/Info (LAME) or VBRI tag, which states the length.

    Without one, libsndfile (mpg123) estimates the frame count from the first frame's bitrate and the
    file size, so a shortfall against it says nothing about truncation.
    """
    pos = 0
    if data[:3] == b"ID3" and len(data) >= 10:  # ID3v2 tag before the first frame
        pos = 10 + _syncsafe(data[6:10]) + (10 if data[5] & 0x10 else 0)
    if len(data) < pos + 4 or data[pos] != 0xFF or data[pos + 1] & 0xE0 != 0xE0:
        return False
    # The tag follows the side information: 9, 17 or 32 bytes after the 4-byte header (MPEG version,
    # channels); VBRI always sits 32 bytes in.
    return (
        any(data[pos + off : pos + off + 4] in (b"Xing", b"Info") for off in (13, 21, 36))
        or data[pos + 36 : pos + 40] == b"VBRI"
    )


def frame_count_is_exact(fmt: str, data: bytes) -> bool:
    """Whether libsndfile's frame count is a promise that decoding must meet, or an estimate (MP3 without
    a length tag). WAV (data chunk size), FLAC (STREAMINFO) and Ogg (granule positions) state it."""
    return fmt != "MP3" or mpeg_length_is_declared(data)


def decode_audio(data: bytes, target_sr: int) -> tuple[np.ndarray, int]:
    """Any libsndfile format, any rate and channel count -> mono float32 at target_sr, DC offset removed.

    Returns (samples, original sample rate). A file whose header promises more frames than it holds
    is an error, not a shorter clip: truncated audio must not be trained on silently. Where the count
    is only an estimate (MP3 without a Xing/Info/VBRI tag) there is no promise to check. NaN or
    infinite samples raise InvalidSamples.

    The DC offset (the clip's mean) is subtracted after the downmix and before resampling: a constant
    offset would otherwise count as signal in the silence checks and the trim, leak into the lowest
    mel bins, and (resampled with the file's edges) ring at both ends.
    """
    missing = riff_data_shortfall(data)
    if missing:
        raise AudioError(f"truncated: the WAV data chunk is {missing} bytes short")
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            sr, promised, exact = f.samplerate, f.frames, frame_count_is_exact(f.format, data)
            y = f.read(dtype="float32", always_2d=True)
    except sf.LibsndfileError as e:
        raise AudioError(f"cannot decode: {e.error_string}") from e
    except (RuntimeError, TypeError) as e:
        raise AudioError(f"cannot decode: {e}") from e
    if exact and promised > 0 and len(y) < promised:
        raise AudioError(f"truncated: header promises {promised} frames, file holds {len(y)}")
    return _mono_at(y, sr, target_sr), sr


class SegmentOutOfRange(AudioError):
    """A segment reaches past its recording's end."""


def decode_span(f, target_sr: int, start_s: float, end_s: float) -> tuple[np.ndarray, int]:
    """Seconds [start_s, end_s) of the recording in the seekable binary file `f`, as `decode_audio`
    gives a whole file: only the span's frames are decoded (libsndfile seeks to the first; where a
    format cannot seek, it decodes up to it and drops what is before). SegmentOutOfRange for a span
    that ends after the recording (by more than one frame: the end in seconds is rounded)."""
    try:
        with sf.SoundFile(f) as sfile:
            sr, total = sfile.samplerate, sfile.frames
            first, last = int(round(start_s * sr)), int(round(end_s * sr))
            if last > total + 1:
                raise SegmentOutOfRange(
                    f"the segment {start_s:g}-{end_s:g} s ends after the recording ({total / sr:g} s)"
                )
            last = min(last, total)
            if sfile.seekable():
                sfile.seek(first)
                y = sfile.read(last - first, dtype="float32", always_2d=True)
            else:
                y = sfile.read(last, dtype="float32", always_2d=True)[first:]
    except sf.LibsndfileError as e:
        raise AudioError(f"cannot decode: {e.error_string}") from e
    except (RuntimeError, TypeError) as e:
        raise AudioError(f"cannot decode: {e}") from e
    if len(y) < last - first:
        raise AudioError(f"truncated: the segment needs {last - first} frames, the recording gave {len(y)}")
    return _mono_at(y, sr, target_sr), sr


def _mono_at(y: np.ndarray, sr: int, target_sr: int) -> np.ndarray:
    """[frames, channels] float32 -> mono at target_sr, DC offset removed (AudioError when empty,
    InvalidSamples for NaN or infinite samples)."""
    if len(y) == 0:
        raise AudioError("no audio frames")
    check_finite(y)
    y = remove_dc(y.mean(axis=1))  # downmix: average of channels
    if sr != target_sr:
        y = load_librosa().resample(y, orig_sr=sr, target_sr=target_sr, res_type="soxr_hq")
    return np.ascontiguousarray(y, dtype=np.float32)


TRIM_FRAME, TRIM_HOP = 2048, 512  # librosa.effects.trim's defaults


def nonsilent_span(y: np.ndarray, top_db: float) -> tuple[int, int]:
    """[start, end) samples of `y` from its first to its last frame whose RMS is within top_db of
    the loudest frame's: `librosa.effects.trim`'s rule and numbers (tested equal to it).

    Built from librosa.feature.rms and librosa.amplitude_to_db because importing librosa.effects
    also imports scikit-learn and scipy.stats (librosa.decompose), a cost in every worker process
    (docs/performance.md#preprocess-start-up).
    """
    librosa = load_librosa()
    db = librosa.amplitude_to_db(
        librosa.feature.rms(y=y, frame_length=TRIM_FRAME, hop_length=TRIM_HOP)[0], ref=np.max, top_db=None
    )
    loud = np.flatnonzero(db > -top_db)
    if loud.size == 0:
        return 0, 0
    return int(loud[0]) * TRIM_HOP, min(y.shape[-1], (int(loud[-1]) + 1) * TRIM_HOP)


VAD_RATES = (8000, 16000, 32000, 48000)  # the rates webrtcvad takes
VAD_FRAME_S = 0.03  # its frames: 10, 20 or 30 ms


def vad_span(y: np.ndarray, sr: int, aggressiveness: int) -> tuple[int, int]:
    """[start, end) samples of `y` from the start of the first to the end of the last 30 ms frame that
    WebRTC's voice activity detector (webrtcvad, `aggressiveness` 0-3) calls speech; (0, 0) for none.
    At a rate webrtcvad does not take, it listens to `y` resampled to 16 kHz (soxr)."""
    import soxr
    import webrtcvad

    rate = sr if sr in VAD_RATES else 16000
    x = y if rate == sr else soxr.resample(y, sr, rate)
    pcm = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2")
    frame = int(VAD_FRAME_S * rate)
    vad = webrtcvad.Vad(aggressiveness)
    voiced = [i for i in range(pcm.size // frame) if vad.is_speech(pcm[i * frame : (i + 1) * frame].tobytes(), rate)]
    if not voiced:
        return 0, 0
    scale = sr / rate
    start = int(round(voiced[0] * frame * scale))
    return start, min(y.shape[-1], int(round((voiced[-1] + 1) * frame * scale)))


def trim(y: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """Strip leading/trailing silence (relative to the clip's peak) when configured."""
    if not cfg.trim_silence:
        return y
    start, end = nonsilent_span(y, cfg.trim_top_db)
    return y[start:end]


@functools.lru_cache(maxsize=8)
def _mel_basis(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    return load_librosa().filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)


def magnitude(y: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """|STFT| of `y`, [1 + n_fft // 2, frames] (Hann window, centred frames: frame i is centred on
    sample i * hop_length). The one transform the mel and the energy are both made from."""
    return np.abs(
        load_librosa().stft(y, n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length, center=True)
    )


def log_mel_of(mag: np.ndarray, sr: int, cfg: MelConfig) -> np.ndarray:
    """Log-mel [frames, n_mels] float32 of a `magnitude` spectrogram: log(max(mel, log_floor))."""
    spec = mag**cfg.power if cfg.power != 1.0 else mag
    mel = _mel_basis(sr, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax) @ spec
    return np.log(np.maximum(mel, cfg.log_floor)).T.astype(np.float32)


def log_mel(y: np.ndarray, sr: int, cfg: MelConfig) -> np.ndarray:
    """Log-mel spectrogram, shape [frames, n_mels], float32: log(max(mel, log_floor)).

    What librosa.feature.melspectrogram computes (Hann window, centred frames, Slaney mel filters),
    with the filter bank built once per setting instead of per clip, and a matmul for its einsum.
    """
    return log_mel_of(magnitude(y, cfg), sr, cfg)


def energy_of(mag: np.ndarray) -> np.ndarray:
    """Energy per frame, float32 [frames]: the L2 norm over frequency of each `magnitude` frame
    (FastSpeech 2's and TensorFlowTTS's definition), from the STFT the mel is made from."""
    return np.sqrt(np.einsum("ft,ft->t", mag, mag, dtype=np.float64)).astype(np.float32)


def num_frames(num_samples: int, hop_length: int) -> int:
    """Frames librosa produces with center=True: 1 + n // hop."""
    return 1 + num_samples // hop_length
