import io

import librosa
import numpy as np
import pytest
import soundfile as sf

from preprocess import audio as A
from preprocess.config import AudioConfig, MelConfig

CFG = MelConfig()


def _wav_bytes(y: np.ndarray, sr: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, sr, format=fmt, subtype="PCM_16" if fmt == "WAV" else None)
    return buf.getvalue()


def test_log_mel_equals_log_of_mel_filterbank_times_stft_magnitude(corpus_dir):
    y, sr = sf.read(corpus_dir / "wavs" / "LJT001-0001.wav", dtype="float32")
    got = A.log_mel(y, sr, CFG)
    stft = np.abs(librosa.stft(y, n_fft=CFG.n_fft, hop_length=CFG.hop_length, win_length=CFG.win_length,
                               center=True))
    basis = librosa.filters.mel(sr=sr, n_fft=CFG.n_fft, n_mels=CFG.n_mels, fmin=CFG.fmin, fmax=CFG.fmax)
    expected = np.log(np.maximum(basis @ stft, CFG.log_floor)).T
    assert got.shape == (A.num_frames(len(y), CFG.hop_length), CFG.n_mels)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_silence_is_exactly_the_log_floor():
    mel = A.log_mel(np.zeros(4096, np.float32), 22050, CFG)
    assert np.all(mel == np.float32(np.log(CFG.log_floor)))


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 22050])
def test_num_frames_matches_librosa_centered_framing(n):
    y = np.random.default_rng(0).standard_normal(max(n, 1)).astype(np.float32)[:n]
    if n == 0:
        assert A.num_frames(0, 256) == 1
        return
    assert A.log_mel(y, 22050, CFG).shape[0] == A.num_frames(n, CFG.hop_length)


def test_decode_resamples_and_downmixes_stereo():
    sr = 16000
    t = np.arange(sr) / sr
    left = 0.5 * np.sin(2 * np.pi * 440 * t)
    stereo = np.stack([left, 0.5 * left], axis=1)
    y, orig = A.decode_audio(_wav_bytes(stereo, sr), 22050)
    assert orig == sr and y.dtype == np.float32 and y.ndim == 1
    assert abs(len(y) - 22050) <= 1
    assert np.max(np.abs(y)) == pytest.approx(0.375, abs=0.01)  # mean of the two channels


def test_decode_reads_flac_and_ogg(corpus_dir):
    for name in ("LJT001-0003.flac", "LJT001-0007.ogg"):
        y, _ = A.decode_audio((corpus_dir / "wavs" / name).read_bytes(), 22050)
        assert len(y) > 22050 // 2


def test_truncated_wav_is_an_error_not_a_short_clip(corpus_dir):
    data = (corpus_dir / "wavs" / "LJT001-0001.wav").read_bytes()
    assert A.riff_data_shortfall(data) == 0
    assert A.riff_data_shortfall(data[:1000]) == len(data) - 1000
    with pytest.raises(A.AudioError, match="truncated"):
        A.decode_audio(data[:1000], 22050)


def test_garbage_bytes_are_an_audio_error():
    with pytest.raises(A.AudioError, match="cannot decode"):
        A.decode_audio(b"\x00\x01garbage" * 100, 22050)


def test_trim_removes_leading_and_trailing_silence():
    sr = 22050
    tone = 0.5 * np.sin(2 * np.pi * 220 * np.arange(sr) / sr).astype(np.float32)
    y = np.concatenate([np.zeros(sr, np.float32), tone, np.zeros(sr, np.float32)])
    trimmed = A.trim(y, AudioConfig())
    assert sr <= len(trimmed) < sr + 2 * 2048
    assert len(A.trim(y, AudioConfig(trim_silence=False))) == len(y)


def test_peak_dbfs():
    assert A.peak_dbfs(np.array([0.5, -1.0], np.float32)) == 0.0
    assert A.peak_dbfs(np.zeros(3, np.float32)) == -np.inf


def test_log_mel_equals_librosa_melspectrogram(corpus_dir):
    y, sr = sf.read(corpus_dir / "wavs" / "LJT001-0002.wav", dtype="float32")
    for power in (1.0, 2.0):
        cfg = MelConfig(power=power)
        ref = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=cfg.n_fft, hop_length=cfg.hop_length,
                                             win_length=cfg.win_length, n_mels=cfg.n_mels, fmin=cfg.fmin,
                                             fmax=cfg.fmax, power=power, center=True)
        np.testing.assert_allclose(A.log_mel(y, sr, cfg), np.log(np.maximum(ref, cfg.log_floor)).T,
                                   rtol=1e-5, atol=1e-5)
