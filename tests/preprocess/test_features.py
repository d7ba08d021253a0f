"""The per-frame features as pure functions: pitch on tones of known f0, energy against a direct
computation, the int16 audio against the mel it gives; their statistics summed per group."""

import pickle

import numpy as np
import pytest

from melshards.preprocess.clip import audio, features
from melshards.preprocess.config import MelConfig, PitchConfig
from melshards.preprocess.stats import feature_stats

librosa = audio.load_librosa()  # imported as the job imports it: one process at a time

SR, HOP = 22050, 256
MEL = MelConfig()


def tone(f0: float, seconds: float, kind: str = "sine") -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    phase = 2 * np.pi * f0 * t
    y = np.sin(phase) if kind == "sine" else 2 * ((f0 * t) % 1.0) - 1  # sawtooth: rich in harmonics
    return (0.5 * y).astype(np.float32)


@pytest.mark.parametrize("tracker", ["dio", "pyin"])
@pytest.mark.parametrize("f0,kind", [(110.0, "sine"), (220.0, "sawtooth"), (330.0, "sine")])
def test_pitch_of_a_tone_is_its_f0_within_3_percent(tracker, f0, kind):
    y = tone(f0, 1.5, kind)
    frames = audio.num_frames(y.size, HOP)
    p = features.pitch(y, SR, HOP, frames, PitchConfig(tracker=tracker))
    voiced = p[p > 0]
    assert p.shape == (frames,) and p.dtype == np.float32
    assert voiced.size > 0.9 * frames
    assert abs(np.median(voiced) / f0 - 1) < 0.03


# pyin's 2048-sample frame spans 8 hops: the frames whose window straddles the change are unvoiced
@pytest.mark.parametrize("tracker,late", [("dio", 1), ("pyin", 5)])
def test_pitch_is_zero_where_the_clip_is_silent_and_follows_a_change_of_f0_at_its_frame(tracker, late):
    y = np.concatenate([tone(120.0, 1.0), tone(240.0, 1.0), np.zeros(SR // 2, np.float32)])
    frames = audio.num_frames(y.size, HOP)
    p = features.pitch(y, SR, HOP, frames, PitchConfig(tracker=tracker))
    switch = SR // HOP  # frame centred on sample SR (the change), give or take one
    assert np.all(p[frames - 20 :] == 0)  # the last 0.23 s of the silence
    assert abs(np.median(p[switch - 30 : switch - 3]) / 120 - 1) < 0.03
    assert abs(np.median(p[switch + 3 : switch + 30]) / 240 - 1) < 0.03
    high = np.flatnonzero(p[switch - 15 : switch + 15] > 180)
    assert 0 <= switch - 15 + high[0] - switch <= late  # the first frame above 180 Hz: at the change


@pytest.mark.parametrize("samples", [SR, SR + 1, SR + HOP - 1, 3 * HOP, 3 * HOP + 7])
def test_pitch_has_one_value_per_mel_frame_for_any_length(samples):
    y = tone(150.0, samples / SR)[:samples]
    frames = audio.num_frames(samples, HOP)
    assert audio.log_mel(y, SR, MEL).shape[0] == frames
    for tracker in ("dio", "pyin"):
        assert features.pitch(y, SR, HOP, frames, PitchConfig(tracker=tracker)).shape == (frames,)


def test_pitch_stays_within_the_configured_range():
    y = tone(70.0, 1.0, "sawtooth")  # near fmin: the refinement may step below it
    p = features.pitch(y, SR, HOP, audio.num_frames(y.size, HOP), PitchConfig(fmin=65.0, fmax=800.0))
    assert np.all((p == 0) | ((p >= 65.0) & (p <= 800.0)))


def test_fit_frames_cuts_or_pads_with_zeros():
    np.testing.assert_array_equal(features.fit_frames(np.array([1.0, 2.0, 3.0]), 2), [1.0, 2.0])
    np.testing.assert_array_equal(features.fit_frames(np.array([1.0]), 3), [1.0, 0.0, 0.0])


def test_energy_is_the_l2_norm_of_each_magnitude_frame_of_the_mels_stft():
    rng = np.random.default_rng(0)
    y = (0.1 * rng.standard_normal(SR)).astype(np.float32) + tone(200.0, 1.0)
    mag = audio.magnitude(y, MEL)
    direct = np.linalg.norm(np.abs(librosa.stft(y, n_fft=1024, hop_length=256, win_length=1024, center=True)), axis=0)
    energy = audio.energy_of(mag)
    assert energy.shape == (audio.num_frames(y.size, HOP),) == (audio.log_mel_of(mag, SR, MEL).shape[0],)
    np.testing.assert_allclose(energy, direct, rtol=1e-5)
    np.testing.assert_array_equal(audio.log_mel_of(mag, SR, MEL), audio.log_mel(y, SR, MEL))


def test_audio_int16_is_the_clip_clipped_scaled_and_zero_padded_to_the_frames():
    y = np.array([0.0, 0.5, -0.5, 1.5, -2.0, 1 / 32767], np.float32)
    out = features.audio_int16(y, 2, 4)
    np.testing.assert_array_equal(out, [0, 16384, -16384, 32767, -32767, 1, 0, 0])
    assert out.dtype == np.int16


def test_the_int16_audio_gives_the_same_log_mel_as_the_clip():
    rng = np.random.default_rng(1)
    y = tone(180.0, 1.2, "sawtooth") * np.hanning(int(SR * 1.2)).astype(np.float32)
    y += (0.01 * rng.standard_normal(y.size)).astype(np.float32)
    frames = audio.num_frames(y.size, HOP)
    stored = features.audio_int16(y, frames, HOP)
    assert stored.size == frames * HOP and not stored[y.size :].any()
    again = audio.log_mel(stored[: y.size].astype(np.float32) / 32767, SR, MEL)
    mel = audio.log_mel(y, SR, MEL)
    loud = mel > -5  # quantisation noise (~1e-4 per mel bin) matters only near the floor
    assert again.shape == mel.shape and loud.mean() > 0.3
    assert np.max(np.abs(again - mel)[loud]) < 0.01


def test_feature_statistics_summed_per_group_keep_a_fixed_size_per_speaker_whatever_its_frames():
    # each group's {split: summary} is summed where its key lands and reduced there (`finish_group`): what
    # the one worker gathering them holds of a speaker (its records, f0 percentiles, centroids) is the same
    # size for 1 clip and for 300 clips of distinct f0 values, and the gathered result is `finish`'s
    rng = np.random.default_rng(5)

    def clip(speaker, split):
        summary = features.clip_summary({"pitch": rng.uniform(80, 400, 50), "energy": rng.uniform(0, 1, 50)})
        return {"speaker": speaker, "language": "en", "split": split}, summary

    clips = [clip("big", ("train", "val")[i % 10 == 0]) for i in range(300)] + [clip("one", "val")]
    parts = [feature_stats.batch_stats(clips[i : i + 32]) for i in range(0, len(clips), 32)]
    groups: dict = {}
    for part in reversed(parts):
        for key, group in part.items():
            feature_stats.add_group(groups.setdefault(key, {}), group)
    shares = {key: feature_stats.finish_group((key, g), ("pitch", "energy")) for key, g in groups.items()}
    big, one = (len(pickle.dumps(shares[("speaker", name)])) for name in ("big", "one"))
    assert abs(big - one) < 64  # digits of the figures, not frames
    gathered = feature_stats.empty_finished(("pitch", "energy"))
    for share in shares.values():
        feature_stats.add_finished(gathered, share)
    assert gathered == feature_stats.finish(feature_stats.merge(parts), ("pitch", "energy"))
    assert gathered["speakers"]["one"]["pitch"]["frames"] == 50  # no training clip: its validation clip's
    assert gathered["pitch_percentiles"]["big"]["count"] == 270 * 50
