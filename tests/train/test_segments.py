"""`melshards.audio_segments`: random (audio, mel) segments for vocoders, static shapes, pure TF,
seeded and resumable, each segment's audio the samples its mel frames are centred on."""

import numpy as np
import pytest
import tensorflow as tf

import melshards
from melshards.preprocess.clip.audio import log_mel
from melshards.preprocess.config import MelConfig
from melshards.shards_schema import SchemaError
from melshards.train.input_pipeline import python_ops_in
from melshards.train.segments import crop

S = 32  # frames per segment


def segments(features_dir, **kw):
    return melshards.audio_segments(str(features_dir / "train-*.tfrecord"), S, 4, **kw)


def test_segments_have_static_shapes_and_no_python_ops(features_dir):
    ds = segments(features_dir)
    hop = melshards.read_schema(str(features_dir)).mel.hop_length
    spec = ds.element_spec
    assert spec["mel"].shape == (4, S, 80) and spec["audio"].shape == (4, S * hop)
    assert spec["mask"].shape == (4, S) and spec["pitch"].shape == (4, S) and spec["energy"].shape == (4, S)
    assert python_ops_in(ds) == []


@pytest.fixture(scope="module")
def seed_3(features_dir, tmp_path_factory):
    """Seed 3's segments two ways: `whole`, the first 6 batches of one iterator; `first`, the first 2 batches
    of another, saved with it (`tf.train.Checkpoint` at `saved`) after them."""
    whole = [{k: v.numpy() for k, v in b.items()} for b in segments(features_dir, seed=3).take(6)]
    it = iter(segments(features_dir, seed=3))
    first = [{k: v.numpy() for k, v in next(it).items()} for _ in range(2)]
    saved = tf.train.Checkpoint(iterator=it).save(str(tmp_path_factory.mktemp("segments") / "ckpt"))
    return {"whole": whole, "first": first, "saved": saved}


def test_the_segments_audio_gives_the_segments_mel(features_dir, seed_3):
    schema = melshards.read_schema(str(features_dir))
    m = schema.mel
    cfg = MelConfig(m.n_fft, m.hop_length, m.win_length, m.n_mels, m.fmin, m.fmax, m.log_floor, m.power)
    full = {}  # every whole record, by its place in the shards
    records = melshards.dataset(
        str(features_dir / "train-*.tfrecord"),
        1,
        shuffle=False,
        repeat=False,
        features=("mel", "mel_len", "audio", "audio_len"),
    )
    for k, r in enumerate(records):
        full[k] = (r["audio"][0].numpy(), r["mel"][0].numpy(), int(r["mel_len"][0]), int(r["audio_len"][0]))
    batch = seed_3["whole"][0]
    checked = 0
    for i in range(4):
        seg_audio = np.rint(batch["audio"][i] * 32767).astype(np.int16)
        a = int(batch["start"][i])
        # find the record: the one whose samples at a * hop are the segment's
        match = [
            k
            for k, (audio, *_) in full.items()
            if np.array_equal(audio[a * m.hop_length :][: S * m.hop_length], seg_audio)
        ]
        assert len(match) == 1
        audio, mel, mel_len, audio_len = full[match[0]]
        valid = int(batch["mask"][i].sum())
        assert valid == min(S, mel_len - a)
        np.testing.assert_array_equal(batch["mel"][i, :valid], mel[a : a + valid])
        again = log_mel(audio[:audio_len].astype(np.float32) / 32767, schema.audio.sample_rate, cfg)[a : a + valid]
        loud = mel[a : a + valid] > -5
        assert np.max(np.abs(again - mel[a : a + valid])[loud], initial=0) < 0.01
        checked += 1
    assert checked == 4


def test_the_same_seed_gives_the_same_segments_and_another_seed_others(features_dir, seed_3):
    def starts(batches):
        return [b["start"].tolist() for b in batches[:2]]

    other = [{"start": b["start"].numpy()} for b in segments(features_dir, seed=2).take(2)]
    assert starts(seed_3["whole"]) == starts(seed_3["first"]) != starts(other)


def test_a_restored_iterator_resumes_on_the_segments_of_an_uninterrupted_run(features_dir, seed_3):
    it2 = iter(segments(features_dir, seed=3))
    tf.train.Checkpoint(iterator=it2).restore(seed_3["saved"])
    for expected in seed_3["whole"][2:]:
        np.testing.assert_array_equal(next(it2)["audio"].numpy(), expected["audio"])


def test_crop_takes_a_short_record_whole_and_pads_it_with_a_mask():
    hop, frames = 4, 6
    mel = tf.reshape(tf.range(2 * frames * 2, dtype=tf.float32), [2, frames, 2])
    mel = tf.where(tf.range(frames)[None, :, None] < tf.constant([3, 6])[:, None, None], mel, -11.5)  # padded
    audio = tf.reshape(tf.cast(tf.range(1, 2 * frames * hop + 1), tf.int16), [2, frames * hop])
    batch = {"mel": mel, "mel_len": tf.constant([3, 6]), "audio": audio, "speaker_id": tf.constant([0, 1])}
    out = crop(batch, tf.constant([0.99, 0.99]), 4, hop, -11.5)
    assert out["start"].numpy().tolist() == [0, 2]  # room 0 for the short record, 2 for the other
    assert out["mask"].numpy().tolist() == [[True, True, True, False], [True] * 4]
    np.testing.assert_array_equal(out["mel"][0, :3], mel[0, :3])
    np.testing.assert_array_equal(out["mel"][0, 3], [-11.5, -11.5])
    np.testing.assert_array_equal(out["mel"][1], mel[1, 2:6])
    np.testing.assert_allclose(out["audio"][1].numpy() * 32767, audio[1, 8:24].numpy())


def test_shards_without_audio_are_refused_naming_the_setting(shards_dir):
    with pytest.raises(SchemaError, match="audio_segments needs the feature 'audio'.*features.audio: true"):
        melshards.audio_segments(str(shards_dir / "train-*.tfrecord"), S, 4)


def test_the_example_vocoder_loop_trains_with_one_trace(features_dir):
    from examples.vocoder import strides_for, train

    assert strides_for(256) == [8, 8, 4] and strides_for(300) == [4, 3, 5, 5]
    out = train(str(features_dir / "train-*.tfrecord"), steps=3, segment_frames=16, batch_size=2)
    assert out["traces"] == 1 and len(out["losses"]) == 3 and all(np.isfinite(out["losses"]))
