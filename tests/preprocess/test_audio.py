import fcntl
import io
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from melshards.preprocess.clip import audio
from melshards.preprocess.config import AudioConfig, MelConfig
from tests.preprocess.conftest import encode, mp3_without_length_tag, tone

librosa = audio.load_librosa()  # imported as the job imports it: one process at a time

CFG = MelConfig()


def _wav_bytes(y: np.ndarray, sr: int, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, sr, format=fmt, subtype="PCM_16" if fmt == "WAV" else None)
    return buf.getvalue()


def noting_the_lock(held: list):
    """import_module that notes (name, whether another open file of the lock is refused) first."""
    real = audio.importlib.import_module

    def probe(name):
        fd = os.open(audio.librosa_lock_path(), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: fails while the lock is held
            held.append((name, False))
        except BlockingIOError:
            held.append((name, True))
        finally:
            os.close(fd)
        return real(name)

    return probe


def test_librosa_s_compiled_modules_are_imported_under_the_lock_until_a_locked_import_marks_them_done(
    monkeypatch, tmp_path
):
    """No two processes compile numba's gufunc caches at once (numba #10128): the first imports holding
    the machine-wide lock and leaves a marker; with the marker there, a process takes no lock."""
    held = []
    monkeypatch.setattr(audio.importlib, "import_module", noting_the_lock(held))
    marker = tmp_path / "compiled.done"
    monkeypatch.setattr(audio, "compiled_marker_path", lambda: str(marker))
    audio.load_librosa.__wrapped__()
    assert held == [(name, True) for name in audio.LIBROSA_COMPILED] + [("librosa", False)] and marker.exists()
    held.clear()
    audio.load_librosa.__wrapped__()
    assert held == [(name, False) for name in audio.LIBROSA_COMPILED] + [("librosa", False)]


def test_the_compiled_marker_names_the_sources_it_was_written_for(monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    before = audio.compiled_marker_path()
    assert before == audio.compiled_marker_path()
    pitch_py = Path(audio.importlib.util.find_spec("librosa.core.pitch").origin)
    assert Path(before).parent == pitch_py.parent / "__pycache__"  # beside numba's caches of librosa
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/elsewhere")
    assert Path(audio.compiled_marker_path()).parent == Path("/elsewhere")


def test_an_emptied_numba_cache_dir_is_compiled_under_the_lock_again(monkeypatch, tmp_path):
    """The marker goes with the caches it vouches for: a recreated environment (same path, same
    hard-linked sources, so the same marker name) compiles under the lock, not side by side."""
    held = []
    monkeypatch.setattr(audio.importlib, "import_module", noting_the_lock(held))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    (tmp_path / "numba").mkdir()
    audio.load_librosa.__wrapped__()
    assert held[0] == (audio.LIBROSA_COMPILED[0], True) and Path(audio.compiled_marker_path()).exists()
    shutil.rmtree(tmp_path / "numba")
    (tmp_path / "numba").mkdir()
    held.clear()
    audio.load_librosa.__wrapped__()
    assert held[0] == (audio.LIBROSA_COMPILED[0], True)


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_doubling_the_amplitude_adds_power_times_log2_above_the_floor(power):
    cfg = MelConfig(power=power)
    y = 0.1 * np.random.default_rng(0).standard_normal(22050).astype(np.float32)  # energy in every band
    quiet, loud = audio.log_mel(y, 22050, cfg), audio.log_mel(2 * y, 22050, cfg)
    above = quiet > np.log(cfg.log_floor) + 1  # clear of the floor in both
    assert above.mean() > 0.9
    np.testing.assert_allclose(loud[above] - quiet[above], power * np.log(2.0), atol=1e-4)


@pytest.mark.parametrize("n_mels,fmin,fmax,bin_", [(80, 0.0, 8000.0, 40), (40, 300.0, 4000.0, 7)])
def test_a_tone_peaks_in_the_mel_band_centred_on_its_frequency(n_mels, fmin, fmax, bin_):
    cfg = MelConfig(n_mels=n_mels, fmin=fmin, fmax=fmax)
    hz = librosa.mel_frequencies(n_mels + 2, fmin=fmin, fmax=fmax)[bin_ + 1]  # centre of band `bin_`
    mel = audio.log_mel(tone(1.0, hz=hz), 22050, cfg)
    assert mel.shape == (audio.num_frames(22050, cfg.hop_length), n_mels) and mel.dtype == np.float32
    assert int(np.argmax(mel[len(mel) // 2])) == bin_


def test_silence_is_exactly_the_log_floor():
    mel = audio.log_mel(np.zeros(4096, np.float32), 22050, CFG)
    assert np.all(mel == np.float32(np.log(CFG.log_floor)))


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 22050])
def test_num_frames_matches_librosa_centered_framing(n):
    y = np.random.default_rng(0).standard_normal(max(n, 1)).astype(np.float32)[:n]
    if n == 0:
        assert audio.num_frames(0, 256) == 1
        return
    assert audio.log_mel(y, 22050, CFG).shape[0] == audio.num_frames(n, CFG.hop_length)


def test_decode_resamples_and_downmixes_stereo():
    sr = 16000
    t = np.arange(sr) / sr
    left = 0.5 * np.sin(2 * np.pi * 440 * t)
    stereo = np.stack([left, 0.5 * left], axis=1)
    y, orig = audio.decode_audio(_wav_bytes(stereo, sr), 22050)
    assert orig == sr and y.dtype == np.float32 and y.ndim == 1
    assert abs(len(y) - 22050) <= 1
    assert np.max(np.abs(y)) == pytest.approx(0.375, abs=0.01)  # mean of the two channels


def test_decode_reads_flac_and_ogg(corpus_dir):
    for name in ("LJT001-0003.flac", "LJT001-0007.ogg"):
        y, _ = audio.decode_audio((corpus_dir / "wavs" / name).read_bytes(), 22050)
        assert len(y) > 22050 // 2


@pytest.mark.parametrize("fmt", ["MP3", "OGG", "FLAC"])
def test_decode_reads_mp3_ogg_and_flac_whole(fmt):
    y = tone(1.0, sr=16000)
    got, sr = audio.decode_audio(encode(y, 16000, fmt), 22050)
    assert sr == 16000 and abs(len(got) - 22050) <= 2
    assert np.max(np.abs(got)) == pytest.approx(np.max(np.abs(y)), rel=0.1)


def test_mp3_without_a_length_tag_is_not_called_truncated():
    y = tone(1.0, lead_silence_s=0.2)
    data = mp3_without_length_tag(y)
    with sf.SoundFile(io.BytesIO(data)) as f:
        assert f.frames > 2 * len(y)  # libsndfile's estimate, not a promise
    assert not audio.mpeg_length_is_declared(data)
    got, _ = audio.decode_audio(data, 22050)
    assert len(y) <= len(got) < len(y) + 2 * 1152  # plus the encoder's delay and padding


def test_truncated_mp3_with_a_length_tag_is_an_error():
    data = encode(tone(1.0), 22050, "MP3")
    assert audio.mpeg_length_is_declared(data)
    with pytest.raises(audio.AudioError, match="truncated"):
        audio.decode_audio(data[: len(data) // 2], 22050)


def test_mpeg_length_tag_is_found_after_an_id3v2_tag():
    data = encode(tone(0.5), 22050, "MP3")
    id3 = b"ID3\x04\x00\x00" + bytes([0, 0, 1, 0]) + bytes(128)  # syncsafe size 128
    assert audio.mpeg_length_is_declared(id3 + data)
    assert not audio.mpeg_length_is_declared(id3 + mp3_without_length_tag(tone(0.5)))


def test_truncated_wav_is_an_error_not_a_short_clip(corpus_dir):
    data = (corpus_dir / "wavs" / "LJT001-0001.wav").read_bytes()
    assert audio.riff_data_shortfall(data) == 0
    assert audio.riff_data_shortfall(data[:1000]) == len(data) - 1000
    with pytest.raises(audio.AudioError, match="truncated"):
        audio.decode_audio(data[:1000], 22050)


def test_garbage_bytes_are_an_audio_error():
    with pytest.raises(audio.AudioError, match="cannot decode"):
        audio.decode_audio(b"\x00\x01garbage" * 100, 22050)


def test_trim_removes_leading_and_trailing_silence():
    sr = 22050
    tone = 0.5 * np.sin(2 * np.pi * 220 * np.arange(sr) / sr).astype(np.float32)
    y = np.concatenate([np.zeros(sr, np.float32), tone, np.zeros(sr, np.float32)])
    trimmed = audio.trim(y, AudioConfig())
    assert sr <= len(trimmed) < sr + 2 * 2048
    assert len(audio.trim(y, AudioConfig(trim_silence=False))) == len(y)


def _trim_cases():
    rng = np.random.default_rng(7)
    sr = 22050
    for seed in range(12):
        lead, tail = rng.integers(0, 3 * sr, 2)
        body = (rng.uniform(0.01, 0.9) * rng.standard_normal(int(rng.integers(100, 2 * sr)))).astype(np.float32)
        quiet = (rng.uniform(0, 1e-3) * rng.standard_normal(lead + tail)).astype(np.float32)
        yield f"noise{seed}", np.concatenate([quiet[:lead], body, quiet[lead:]])
    yield "tone_after_silence", tone(1.3, lead_silence_s=0.7)
    yield "digital_silence", np.zeros(sr, np.float32)
    yield "shorter_than_a_frame", tone(0.05)
    yield (
        "demo_clip",
        librosa.load(str(Path(__file__).parents[2] / "data/ljspeech_tiny/wavs/LJT001-0001.wav"), sr=None)[0],
    )


@pytest.mark.parametrize("top_db", [20, 40, 60])
def test_trim_gives_librosa_effects_trims_samples_exactly(top_db):
    for name, y in _trim_cases():
        expected, _ = librosa.effects.trim(y, top_db=top_db)
        got = audio.trim(y, AudioConfig(trim_top_db=top_db))
        assert got.shape == expected.shape and np.array_equal(got, expected), name


def test_log_mel_equals_librosa_melspectrogram(corpus_dir):
    """log_mel builds the filter bank once and multiplies; it must equal librosa's one-call reference,
    at the defaults and at settings where every parameter differs from them."""
    y, sr = sf.read(corpus_dir / "wavs" / "LJT001-0002.wav", dtype="float32")
    other = dict(n_fft=512, hop_length=160, win_length=400, n_mels=40, fmin=60.0, fmax=7000.0, log_floor=1e-4)
    for cfg in (MelConfig(), MelConfig(power=2.0, **other)):
        power = cfg.power
        ref = librosa.feature.melspectrogram(
            y=y,
            sr=sr,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            n_mels=cfg.n_mels,
            fmin=cfg.fmin,
            fmax=cfg.fmax,
            power=power,
            center=True,
        )
        np.testing.assert_allclose(
            audio.log_mel(y, sr, cfg), np.log(np.maximum(ref, cfg.log_floor)).T, rtol=1e-5, atol=1e-5
        )


# -- DC offset and invalid samples ---------------------------------------------------------------
def _float_wav(y: np.ndarray, sr: int = 22050) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, sr, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def test_remove_dc_subtracts_the_mean():
    np.testing.assert_array_equal(
        audio.remove_dc(np.array([1.0, 2.0, 3.0, 6.0], np.float32)), np.array([-2.0, -1.0, 0.0, 3.0], np.float32)
    )
    assert audio.remove_dc(np.full(44100, 0.3, np.float32)).tolist() == [0.0] * 44100


@pytest.mark.parametrize("sr", [22050, 16000])
def test_decoded_constant_dc_is_all_zeros_also_after_resampling(sr):
    y, _ = audio.decode_audio(_wav_bytes(np.full(2 * sr, 0.3), sr), 22050)
    assert len(y) == 2 * 22050 and np.max(np.abs(y)) < 1e-6  # removed before resampling: no edge ringing
    assert not audio.decode_audio(_wav_bytes(np.full(2 * sr, 0.3), sr), sr)[0].any()


def test_decoding_removes_a_dc_offset_and_keeps_the_rest():
    y = tone(1.0)
    got, _ = audio.decode_audio(_float_wav(y + 0.2), 22050)
    np.testing.assert_allclose(got, y - y.mean(dtype=np.float64), atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("sr", [22050, 16000])
def test_nan_or_infinite_samples_are_invalid_samples_without_a_warning(bad, sr):
    y = tone(1.0, sr=sr)
    y[[100, 101, 5000]] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(audio.InvalidSamples) as e:
            audio.decode_audio(_float_wav(y, sr), 22050)
    nan, inf = (3, 0) if np.isnan(bad) else (0, 3)
    assert str(e.value) == f"{nan} NaN and {inf} infinite samples, the first at frame 100"
    assert isinstance(e.value, audio.AudioError)


def test_a_nan_in_one_channel_of_a_stereo_file_is_invalid():
    stereo = np.stack([tone(0.5), tone(0.5)], axis=1)
    stereo[7, 1] = np.nan
    with pytest.raises(audio.InvalidSamples, match="1 NaN and 0 infinite samples, the first at frame 7"):
        audio.decode_audio(_float_wav(stereo), 22050)


def _load(tmp_path, y, sr=22050):
    from melshards.preprocess.clip.clips import load_trimmed
    from melshards.preprocess.config import PreprocessConfig

    path = tmp_path / "c.wav"
    path.write_bytes(_float_wav(y, sr))
    return load_trimmed(str(path), PreprocessConfig())


def _rejection(tmp_path, y, sr=22050):
    from melshards.preprocess.clip.clips import ClipRejected

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # librosa used to warn about NaN on the console
        with pytest.raises(ClipRejected) as e:
            _load(tmp_path, y, sr)
    return e.value.reason, e.value.detail


def test_two_seconds_of_constant_dc_are_silent_audio_not_a_clip(tmp_path):
    reason, detail = _rejection(tmp_path, np.full(2 * 22050, 0.3, np.float32))
    assert reason == "silent_audio" and detail.startswith("no signal: every sample has the same value")


def test_nan_samples_are_invalid_samples_not_silent_audio(tmp_path):
    y = tone(1.0)
    y[10:20] = np.nan
    reason, detail = _rejection(tmp_path, y)
    assert (reason, detail) == (
        "invalid_samples",
        f"{tmp_path / 'c.wav'}: 10 NaN and 0 infinite samples, the first at frame 10",
    )


def test_a_dc_offset_does_not_change_the_trimmed_clip_or_its_mel(tmp_path):
    """The mel is computed from the samples less their DC offset: a clip recorded with an offset gives
    the same clip (silence trimmed as without it) and the same mel as the clip without one."""
    from melshards.preprocess.config import PreprocessConfig

    y = tone(1.0, lead_silence_s=0.5)
    clean, offset = _load(tmp_path, y), _load(tmp_path, y + 0.25)
    assert len(clean) < len(y) - 0.4 * 22050  # the leading silence is trimmed, with the offset too
    assert offset.shape == clean.shape
    np.testing.assert_allclose(offset, clean, atol=1e-6)
    mel = PreprocessConfig().mel
    np.testing.assert_allclose(audio.log_mel(offset, 22050, mel), audio.log_mel(clean, 22050, mel), atol=1e-3)
