"""same_clip references: the in-graph slice of a record's own mel (static shape, seeded, resumable)."""

import numpy as np
import tensorflow as tf

from melshards.train.references import same_clip_reference, with_same_clip_references


def _batch():
    mel = np.arange(3 * 12 * 2, dtype=np.float32).reshape(3, 12, 2)
    mel_len = np.array([12, 7, 3], np.int32)
    return mel, mel_len


def test_the_slice_is_the_records_own_frames_padded_past_mel_len_with_a_static_shape():
    mel, mel_len = _batch()
    fn = tf.function(lambda m, n, s: same_clip_reference(m, n, 5, s, -9.0))
    out = {k: v.numpy() for k, v in fn(tf.constant(mel), tf.constant(mel_len), tf.constant([1, 2], tf.int64)).items()}
    concrete = fn.get_concrete_function(
        tf.TensorSpec([3, 12, 2]), tf.TensorSpec([3], tf.int32), tf.TensorSpec([2], tf.int64)
    )
    assert concrete.structured_outputs["reference_mel"].shape == (3, 5, 2)
    for b in range(3):
        start, n = out["reference_start"][b], out["reference_len"][b]
        assert 0 <= start <= max(mel_len[b] - 5, 0) and n == min(5, mel_len[b] - start)
        np.testing.assert_array_equal(out["reference_mel"][b, :n], mel[b, start : start + n])
        assert np.all(out["reference_mel"][b, n:] == -9.0)
    assert out["reference_start"][2] == 0 and out["reference_len"][2] == 3  # shorter than the slice: whole


def test_the_same_seed_and_step_cut_the_same_slices_and_other_steps_others():
    mel = np.zeros((64, 300, 1), np.float32)
    mel_len = np.full(64, 300, np.int32)

    def starts(seed):
        return same_clip_reference(mel, mel_len, 10, tf.constant(seed, tf.int64), 0.0)["reference_start"].numpy()

    np.testing.assert_array_equal(starts([5, 3]), starts([5, 3]))
    assert not np.array_equal(starts([5, 3]), starts([5, 4]))
    assert not np.array_equal(starts([6, 3]), starts([5, 3]))


def test_a_resumed_iterator_cuts_what_an_uninterrupted_one_would(tmp_path):
    mel, mel_len = _batch()
    ds = tf.data.Dataset.from_tensors({"mel": mel, "mel_len": mel_len}).repeat(6)
    refs = with_same_clip_references(ds, 5, 11, -9.0, ("mel_len",))
    whole = [b["reference_mel"].numpy() for b in refs]
    it = iter(refs)
    next(it), next(it)
    path = tf.train.Checkpoint(it=it).write(str(tmp_path / "it"))
    resumed = iter(refs)
    tf.train.Checkpoint(it=resumed).read(path).assert_consumed()
    np.testing.assert_array_equal(np.stack(whole[2:]), np.stack([b["reference_mel"].numpy() for b in resumed]))
    assert any(not np.array_equal(whole[0], w) for w in whole)  # each batch its own draw
    assert set(next(iter(refs))) == {"mel_len", "reference_mel", "reference_len"}


def test_a_bucket_shorter_than_the_reference_gives_its_whole_mel_padded():
    """A length bucket of fewer frames than `frames` (short clips): the whole record, then the pad value."""
    mel = np.arange(2 * 4, dtype=np.float32).reshape(2, 4, 1)
    out = same_clip_reference(tf.constant(mel), tf.constant([4, 2], tf.int32), 6, tf.constant([0, 1], tf.int64), -9.0)
    np.testing.assert_array_equal(out["reference_mel"].numpy()[..., 0], [[0, 1, 2, 3, -9, -9], [4, 5, -9, -9, -9, -9]])
    assert out["reference_len"].numpy().tolist() == [4, 2] and out["reference_start"].numpy().tolist() == [0, 0]
