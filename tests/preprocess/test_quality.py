"""The quality measures (melshards.preprocess.clip.quality) for exact values on synthetic signals, and how they
travel: the clip carries them, the feature cache keeps them, a manifest's asr_text feeds them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from melshards.preprocess.clip import audio, cache, clips, quality
from melshards.preprocess.config import MelConfig, PreprocessConfig
from melshards.preprocess.inputs import manifests
from melshards.preprocess.inputs.rows import LayoutRows, row
from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.stats import Moments
from tests.preprocess.conftest import encode

SR = 16000


def _sine(seconds: float, hz: float = 1000.0, amplitude: float = 0.5, sr: int = SR) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


def test_speaking_rate_is_symbols_per_second_of_speech_and_nan_without_speech():
    assert quality.speaking_rate(30, 2.0) == 15.0
    assert math.isnan(quality.speaking_rate(5, 0.0))


def test_longest_pause_is_the_longest_quiet_run_inside_the_speech_not_at_its_edges():
    s, gap = _sine(1.0), np.zeros(SR // 2, np.float32)
    y = np.concatenate([np.zeros(SR, np.float32), s, gap, s, np.zeros(SR // 4, np.float32), s, gap])
    assert quality.longest_pause_s(y, SR, top_db=40.0) == 0.5
    assert quality.longest_pause_s(s, SR, top_db=40.0) == 0.0


def _noisy_speech(snr_db: float, gap_s: float, seed: int = 0) -> np.ndarray:
    """Sixteen 0.2 s bursts of a 150 Hz harmonic series, 0.1 s apart, with a gap of `gap_s` after the
    eighth, in white noise `snr_db` below the bursts' power; every edge on a 10 ms block."""
    t = np.arange(int(0.2 * SR)) / SR
    burst = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 20)) * 0.1
    space = np.zeros(int(0.1 * SR))
    half = np.concatenate([np.concatenate([burst, space]) for _ in range(8)])[: -space.size]
    clean = np.concatenate([half, np.zeros(int(gap_s * SR)), half])
    noise = np.random.default_rng(seed).standard_normal(clean.size) * np.sqrt(np.mean(burst**2) / 10 ** (snr_db / 10))
    return (clean + noise).astype(np.float32)


def test_a_pause_of_room_noise_is_measured_against_the_noise_floor():
    # 20 dB SNR: the floor is within top_db (40) of the loudest block, so no block is 40 dB below it;
    # the 2 s gap is every block less than 6 dB above the floor
    y = _noisy_speech(20.0, 2.0)
    levels = quality.noise_levels(y, SR)
    assert quality.longest_pause_s(y, SR, 40.0) == 0.0  # top_db alone
    assert quality.longest_pause_s(y, SR, 40.0, levels) == 2.0
    assert quality.longest_pause_s(_noisy_speech(20.0, 0.0), SR, 40.0, levels) == 0.1  # the spaces alone
    # a steady sound has no floor: top_db alone, not every block of the tone a pause
    assert all(math.isnan(v) for v in quality.noise_levels(_sine(1.0), SR))


def test_a_noise_floor_a_few_db_below_the_speech_does_not_make_the_speech_a_pause():
    # 6 dB SNR: the speech level is less than 12 dB above the floor, which then marks no pause
    y = _noisy_speech(6.0, 2.0)
    floor, level = quality.noise_levels(y, SR)
    assert level < 16 * floor
    assert quality.longest_pause_s(y, SR, 40.0, (floor, level)) == 0.0


def test_a_click_inside_a_pause_does_not_end_it_and_a_sound_of_30_ms_does():
    block = SR // 100

    def pause_with(burst_blocks: int) -> float:
        gap = np.zeros(120 * block, np.float32)
        gap[60 * block : (60 + burst_blocks) * block] = _sine(burst_blocks / 100)
        return quality.longest_pause_s(np.concatenate([_sine(1.0), gap, _sine(1.0)]), SR, 40.0)

    assert pause_with(2) == 1.2  # a 20 ms click: one pause of 1.2 s
    assert pause_with(3) == 0.6  # a 30 ms sound: two pauses of 0.6 s


def test_clipping_counts_samples_at_full_scale_and_their_longest_run():
    # 16 samples a period: |2 sin| >= 0.99 for 5 consecutive samples in each half period
    clipped = np.clip(2 * _sine(1.0, amplitude=1.0), -1.0, 1.0)
    assert quality.clipping(clipped) == (10 / 16, 5.0)
    assert quality.clipping(_sine(1.0)) == (0.0, 0.0)


def test_bandwidth_is_the_highest_bin_within_the_floor_of_the_strongest():
    mag = np.zeros((513, 10))
    mag[:101] = 1.0
    mag[300] = 10.0 ** (-60 / 20)  # 60 dB down: no real energy
    assert quality.bandwidth_hz(mag, SR, 1024) == 100 * SR / 1024


def test_bandwidth_of_noise_resampled_up_from_8_khz_stops_near_4_khz():
    import soxr

    noise = np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1
    cfg = MelConfig(fmax=8000.0)
    narrow = quality.bandwidth_hz(audio.magnitude(soxr.resample(noise, 8000, SR), cfg), SR, cfg.n_fft)
    full = np.random.default_rng(1).standard_normal(SR).astype(np.float32) * 0.1
    # soxr's anti-imaging filter lets the first 0.3 kHz above 4 kHz through, more than 50 dB down
    assert 3500 < narrow < 4400
    assert quality.bandwidth_hz(audio.magnitude(full, cfg), SR, cfg.n_fft) == SR / 2


def _nyquist_blocks(*amplitudes: float) -> np.ndarray:
    """One 20 ms block per amplitude, each a square wave at the Nyquist frequency (power amplitude**2)."""
    block = int(quality.NOISE_BLOCK_S * SR)
    return np.concatenate([a * np.tile([1.0, -1.0], block // 2) for a in amplitudes])


def test_snr_is_the_loud_half_over_the_quietest_tenth_of_the_recorded_blocks():
    y = _nyquist_blocks(*[1.0] * 100, *[0.01] * 100)  # powers 1 and 1e-4, half each
    assert quality.noise_levels(y, SR) == (pytest.approx(1e-4), 1.0)
    assert quality.snr_db(y, SR) == pytest.approx(10 * math.log10((1 - 1e-4) / 1e-4), abs=1e-9)


def test_digital_silence_is_no_noise_floor_so_padding_leaves_the_snr():
    y = _noisy_speech(5.0, 0.0)
    unpadded = quality.snr_db(y, SR)
    block = int(quality.NOISE_BLOCK_S * SR)
    lsb = 2.0**-15
    dither = np.random.default_rng(1).integers(-1, 2, 12 * block) * lsb  # +-1 step of 16 bits
    for pad in (np.zeros(12 * block), np.full(12 * block, -0.003), dither):  # 0.24 s: whole blocks
        padded = np.concatenate([pad, y, pad]).astype(np.float32)
        assert quality.snr_db(padded, SR) == unpadded
    quarter = np.zeros(SR // 4, np.float32)  # 0.25 s: a block holds the edge of the noise
    assert quality.snr_db(np.concatenate([quarter, y, quarter]), SR) == pytest.approx(unpadded, abs=0.5)
    assert 5.0 < unpadded < 8.0  # the estimate reads the bursts' level over the noise
    # silence inside the clip (a gated pause) is no floor either; a steady tone has none
    gated = np.concatenate([y[: y.size // 2], np.zeros(SR), y[y.size // 2 :]])
    assert quality.snr_db(gated, SR) == pytest.approx(unpadded, abs=0.5)


def test_a_steady_sound_has_no_noise_floor_and_noise_alone_reads_below_0_db():
    from scipy import signal

    saw = (0.5 * signal.sawtooth(2 * np.pi * 100 * np.arange(2 * SR) / SR)).astype(np.float32)
    assert math.isnan(quality.snr_db(saw, SR))  # 20 ms blocks of a 100 Hz sawtooth: one power
    assert math.isnan(quality.snr_db(np.concatenate([_sine(1.0), np.zeros(SR, np.float32)]), SR))
    assert math.isnan(quality.snr_db(np.zeros(SR, np.float32), SR))  # digital silence only
    assert math.isnan(quality.snr_db(_sine(0.03), SR))  # one whole block
    noise = np.random.default_rng(0).standard_normal(2 * SR).astype(np.float32) * 0.1
    assert -10.0 < quality.snr_db(noise, SR) < 0.0  # noise as loud as anything in the clip: noisy


def test_loudness_of_a_full_scale_997_hz_sine_is_minus_3_lufs_and_peak_is_its_amplitude():
    sr = 48000
    assert quality.loudness_lufs(_sine(3.0, 997.0, 1.0, sr), sr) == pytest.approx(-3.01, abs=0.05)
    assert math.isnan(quality.loudness_lufs(_sine(0.3, sr=sr), sr))  # shorter than one gating block
    assert quality.peak_dbfs(_sine(1.0)) == pytest.approx(20 * math.log10(0.5))
    assert quality.peak_dbfs(np.array([0.5, -1.0], np.float32)) == 0.0
    assert math.isnan(quality.peak_dbfs(np.zeros(3, np.float32))) and math.isnan(quality.peak_dbfs(np.zeros(0)))
    y = _sine(3.0, 997.0, 0.1, sr)
    gain = quality.loudness_gain(y, sr, -23.0)
    assert quality.loudness_lufs(y * gain, sr) == pytest.approx(-23.0, abs=1e-6)


def test_cer_compares_normalised_words_and_is_nan_without_an_asr_text():
    assert quality.cer("Hello, world!", "hello word") == 1 / 11
    assert math.isnan(quality.cer("Hello.", None))
    assert math.isnan(quality.cer("Hello.", "  "))


def test_asr_repeat_is_the_most_back_to_back_repeats_of_a_phrase():
    assert quality.asr_repeat("and then a b a b a b c") == 3.0
    assert quality.asr_repeat("the cat sat on the mat") == 1.0
    assert quality.asr_repeat("Go, go. GO!") == 3.0
    assert math.isnan(quality.asr_repeat("..."))


def test_foreign_script_fraction_counts_letters_outside_the_languages_scripts():
    assert quality.foreign_script_fraction("hello мир", "en") == 3 / 8
    assert quality.foreign_script_fraction("привет, мир", "ru-RU") == 0.0
    assert quality.foreign_script_fraction("日本語とカタカナ", "ja") == 0.0
    assert quality.foreign_script_fraction("abc d ж", "xx") == 1 / 5  # unlisted: the majority script
    assert quality.foreign_script_fraction("Tokyo 東京", "en") == 2 / 7
    assert math.isnan(quality.foreign_script_fraction("123 ...", "en"))


def test_foreign_script_reads_the_script_property_after_nfkc_and_common_letters_are_never_foreign():
    from fontTools.unicodedata import Scripts

    assert quality.foreign_script_fraction("時々ラーメン", "ja") == 0.0  # 々 is Han; ー is Common, not counted
    assert quality.foreign_script_fraction("ラーメン and", "ja") == 3 / 6  # ー counts on neither side
    assert quality.foreign_script_fraction("ＡＢＣ abc", "en") == 0.0  # fullwidth Latin is Latin
    assert quality.foreign_script_fraction("1º and 2ª", "es") == 0.0  # the ordinals are o and a
    assert quality.foreign_script_fraction("ー abc", "en") == 0.0
    assert math.isnan(quality.foreign_script_fraction("ーー", "ja"))  # no letter of any one script
    assert {s for scripts in quality.LANGUAGE_SCRIPTS.values() for s in scripts} <= set(Scripts.NAMES)
    assert [quality.letter_script(c) for c in "aж日かカ한ー"] == "Latn Cyrl Hani Hira Kana Hang Zyyy".split()


def test_audio_hash_is_the_same_for_one_recording_as_wav_and_flac_and_differs_for_other_audio():
    y = (_sine(0.5) * 32767).astype(np.int16)  # the recording's samples: each container stores them as they are
    wav, flac = encode(y, SR, "WAV"), encode(y, SR, "FLAC")
    assert wav != flac
    assert quality.audio_hash(audio.decode_audio(wav, SR)[0]) == quality.audio_hash(audio.decode_audio(flac, SR)[0])
    assert quality.audio_hash(_sine(0.5)) != quality.audio_hash(_sine(0.5, hz=999.0))


def test_measure_quality_gives_every_measure_in_order_with_the_asr_text_rules_on_the_asr_text():
    y = np.concatenate([_sine(1.0), np.zeros(SR // 2, np.float32), _sine(1.0)])
    measured = quality.audio_quality(y, 0, y.size, SR, None, 1024, 40.0)
    assert tuple(measured) == quality.AUDIO_MEASURES
    q = quality.measure_quality(measured, "One two three.", 13, 2.5, "en", asr_text="one two two two three")
    assert tuple(q) == quality.MEASURES and set(quality.UNITS) == {*quality.MEASURES, *quality.OPTIONAL_MEASURES}
    assert all(isinstance(v, float) for v in q.values())
    assert (q["speaking_rate"], q["longest_pause_s"], q["asr_repeat"]) == (5.2, 0.5, 3.0)
    assert q["cer"] == 8 / 13
    assert math.isnan(q["bandwidth_hz"])  # no STFT given
    assert quality.measure_quality(measured, "go go go", 8, 1.0, "en")["asr_repeat"] == 3.0


def test_webrtcvad_finds_no_speech_in_silence_and_the_trim_rejects_it():
    assert audio.vad_span(np.zeros(SR, np.float32), SR, 2) == (0, 0)
    cfg = PreprocessConfig()
    cfg = dataclasses.replace(cfg, audio=dataclasses.replace(cfg.audio, trim_method="webrtcvad"))
    with pytest.raises(clips.ClipRejected, match="nothing left"):
        clips.trim_span(np.zeros(22050, np.float32), cfg)


def test_a_manifest_asr_text_column_reaches_the_row():
    text = "audio,text,asr_text\na.wav,Hallo.,hallo\nb.wav,Hi.,\n"
    read = LayoutRows.of(manifests.manifest_rows(text.splitlines(keepends=True), "/m/x.csv", "/m"))
    assert read.rows == [row("a", "Hallo.", "/m/a.wav", 0, asr_text="hallo"), row("b", "Hi.", "/m/b.wav", 1)]
    assert read.rows[0]["asr_text"] == "hallo" and "asr_text" not in read.rows[1]


def test_the_clip_carries_its_measures_and_hash_and_the_feature_cache_gives_them_back(tmp_path):
    """One clip measured, written to the cache, read back: the same span, hash and measures, and the clip
    measured from the cached span equals the one measured from the audio."""
    sr = PreprocessConfig().audio.sample_rate
    y = np.concatenate([_sine(0.8, 220.0, sr=sr), np.zeros(sr // 2, np.float32), _sine(0.8, 220.0, sr=sr)])
    (tmp_path / "a.wav").write_bytes(encode(y, sr, "WAV"))
    cfg = PreprocessConfig()
    cfg = dataclasses.replace(cfg, quality=dataclasses.replace(cfg.quality, loudness=True))
    r = row("a", "Hello there.", str(tmp_path / "a.wav"), 0, speaker="s", language="en", asr_text="hello there")
    clip, features, span = clips.featurize_span(r, cfg)
    assert clip["audio_hash"] == span["audio_hash"] and tuple(clip["quality"]) == quality.MEASURES
    assert clip["quality"]["cer"] == 0.0 and clip["quality"]["longest_pause_s"] > 0.4
    assert not math.isnan(clip["quality"]["loudness_lufs"])
    assert math.isnan(clips.featurize_span(r, PreprocessConfig())[0]["quality"]["loudness_lufs"])  # off by default
    path = cache.write_batch(str(tmp_path / "cache"), [("k", span, features, Moments.of(features["mel"]))])
    cached_span, cached_arrays, _ = cache.read_batch(path)["k"]
    assert cached_span["audio_hash"] == span["audio_hash"]
    assert cached_span["quality"] == pytest.approx(span["quality"], nan_ok=True)
    again, _, _ = clips.featurize_span(r, cfg, analysed=(cached_span, cached_arrays))
    assert again["quality"] == pytest.approx(clip["quality"], nan_ok=True)
    off = dataclasses.replace(cfg, quality=dataclasses.replace(cfg.quality, measures=False))
    unmeasured, _, _ = clips.featurize_span(r, off)
    assert all(math.isnan(v) for v in unmeasured["quality"].values()) and unmeasured["audio_hash"] == clip["audio_hash"]


def _voice(sr: int) -> np.ndarray:
    """0.5 s of silence, 1 s of a 150 Hz harmonic series with a 4 Hz swell, 0.5 s of silence."""
    t = np.arange(sr) / sr
    v = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 20)) * 0.2 * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    return np.concatenate([np.zeros(sr // 2), v, np.zeros(sr // 2)]).astype(np.float32)


def test_webrtcvad_trims_to_the_30_ms_frames_it_calls_speech_at_a_rate_it_does_not_take():
    # 22.05 kHz is heard at 16 kHz: frame 16 (of 480 samples there) starts at 10584 here, 441 before the onset
    assert audio.vad_span(_voice(22050), 22050, 2) == (10584, 35721)


def test_loudness_normalisation_scales_the_mel_by_the_gain_and_leaves_the_measures_as_decoded(tmp_path):
    sr = 22050
    (tmp_path / "v.wav").write_bytes(encode(_voice(sr), sr, "WAV"))
    cfg = PreprocessConfig()
    cfg = dataclasses.replace(cfg, quality=dataclasses.replace(cfg.quality, loudness=True))
    louder = dataclasses.replace(cfg, audio=dataclasses.replace(cfg.audio, loudness_target_lufs=-16.0))
    span, plain = clips.analyse_audio(str(tmp_path / "v.wav"), cfg)
    span_l, normalised = clips.analyse_audio(str(tmp_path / "v.wav"), louder)
    gain = 10 ** ((-16.0 - span["quality"]["loudness_lufs"]) / 20)
    above = plain["mel"] > np.log(cfg.mel.log_floor) + 1
    assert np.allclose(normalised["mel"][above] - plain["mel"][above], np.log(gain), atol=1e-4)
    assert span_l["quality"] == span["quality"] and span_l["audio_hash"] == span["audio_hash"]


def test_a_loudness_target_out_of_range_is_refused_naming_its_bounds():
    cfg = PreprocessConfig()
    with pytest.raises(ConfigError, match=r"audio.loudness_target_lufs is 5.0, must be >= -70 and <= 0"):
        dataclasses.replace(cfg, audio=dataclasses.replace(cfg.audio, loudness_target_lufs=5.0)).validate()
