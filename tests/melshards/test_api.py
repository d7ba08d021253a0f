"""The public API: melshards.dataset feeds model.fit with static shapes, one trace per shape."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import melshards


def _length_model(schema, text_len=None):
    """A stock Keras model (predicts an utterance's log mel frames from its text ids), with a layer
    that counts the traces of the functions it runs in: Python runs only while tracing."""
    import keras
    import tensorflow as tf

    class TraceCounter(keras.layers.Layer):
        traces: list = []

        def call(self, x):
            if isinstance(x, tf.Tensor) and not tf.executing_eagerly():
                self.traces.append(tuple(x.shape))
            return x

    counter = TraceCounter()
    counter.traces = []
    model = keras.Sequential(
        [
            keras.Input((text_len,), dtype="int32"),
            counter,
            keras.layers.Embedding(len(schema.vocabulary), 8),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    # built before fit: variables an optimizer creates inside its first trace make Keras trace again
    model.optimizer.build(model.trainable_variables)
    del counter.traces[:]  # Keras' symbolic build of the Sequential model above is not a train trace
    return model, counter.traces


def _xy(batch):
    import tensorflow as tf

    return batch["text_ids"], tf.math.log(tf.cast(batch["mel_len"], tf.float32))


def test_importing_melshards_imports_no_tensorflow():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, melshards; melshards.__all__; print('tensorflow' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_model_fit_on_melshards_dataset_has_static_shapes_finite_loss_and_one_trace(shards_dir):
    schema = melshards.read_schema(str(shards_dir))
    ds = melshards.dataset(str(shards_dir / "train-*.tfrecord"), 4, seed=1)
    spec = ds.element_spec
    assert spec["mel"].shape.as_list() == [4, schema.max_mel_frames, schema.n_mels]
    assert spec["text_ids"].shape.as_list() == [4, schema.max_text_len]
    assert all(s.shape.is_fully_defined() for s in spec.values())
    model, traces = _length_model(schema, schema.max_text_len)
    history = model.fit(ds.map(_xy), steps_per_epoch=5, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert traces == [(4, schema.max_text_len)], traces


def test_split_and_one_pass_read_every_val_record_once_in_order(shards_dir):
    from tests.train.conftest import ids_in

    schema = melshards.read_schema(str(shards_dir / "schema.json"))
    ds = melshards.dataset(
        str(shards_dir / "*.tfrecord"), 1, split="val", shuffle=False, repeat=False, features=("id", "mel_len")
    )
    ids = [b["id"].numpy()[0] for b in ds]
    every = ids_in(sorted(str(p) for p in shards_dir.glob("val-*.tfrecord")))
    assert len(set(every)) == len(every) == schema.counts["val"] > 1
    assert sorted(ids) == sorted(every)  # each val record once, no train record
    again = [b["id"].numpy()[0] for b in ds]
    assert ids == again


def test_normalizer_inverts_to_the_input(shards_dir):
    import tensorflow as tf

    schema = melshards.read_schema(str(shards_dir))
    norm = melshards.normalizer(schema)
    mel = next(iter(melshards.dataset(str(shards_dir / "train-*.tfrecord"), 2)))["mel"]
    x = norm(mel)
    assert abs(float(tf.reduce_mean(x))) < 5.0
    np.testing.assert_allclose(norm.invert(x).numpy(), mel.numpy(), atol=1e-4)


def test_buckets_each_have_static_shapes_and_fit_traces_once_per_shape(bucketed_dir):
    schema = melshards.read_schema(str(bucketed_dir))
    assert len(schema.buckets) > 1
    per_bucket = melshards.bucket_datasets(str(bucketed_dir / "train-*.tfrecord"), 2)
    assert sorted(per_bucket) == [b.index for b in schema.buckets]
    for i, ds in per_bucket.items():
        assert ds.element_spec["mel"].shape.as_list() == [2, schema.buckets[i].max_mel_frames, schema.n_mels]
    mixed = melshards.dataset(str(bucketed_dir / "train-*.tfrecord"), 2)
    shapes = {tuple(b["text_ids"].shape) for b in mixed.take(40)}
    assert shapes <= {(2, b.max_text_len) for b in schema.buckets} and len(shapes) > 1
    model, traces = _length_model(schema)
    history = model.fit(mixed.map(_xy), steps_per_epoch=20, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    # each bucket shape traces once at most: no shape is traced twice
    assert len(traces) == len(set(traces)) <= len(schema.buckets), traces


def test_a_bucket_the_shards_do_not_hold_is_refused(shards_dir):
    from melshards.shards_schema.shards import InputError

    with pytest.raises(InputError, match="bucket 3"):
        melshards.dataset(str(shards_dir / "train-*.tfrecord"), 2, bucket=3)


def test_a_shard_schema_json_does_not_list_is_checked_and_named_before_reading(bucketed_dir, tmp_path):
    import shutil

    from melshards.shards_schema.shards import InputError

    run = tmp_path / "run"
    shutil.copytree(bucketed_dir, run)
    # a copy of a bucket-0 shard under another bucket-0 name reads fine (a renamed or copied-in shard)
    shutil.copy(next(run.glob("train-b00-*.tfrecord")), run / "train-b00-00098-of-00100.tfrecord")
    per_bucket = melshards.bucket_datasets(str(run / "train-*.tfrecord"), 2)
    assert 0 in per_bucket
    # bucket 1's records under a bucket-0 name: today a DecodeRaw error, while reading, naming no file
    stray = run / "train-b00-00099-of-00100.tfrecord"
    shutil.copy(next(run.glob("train-b01-*.tfrecord")), stray)
    with pytest.raises(InputError) as e:
        melshards.dataset(str(run / "train-*.tfrecord"), 2)
    message = str(e.value)
    assert message.startswith(f"{stray}: record 0: wrong shape:") and "\n" not in message
    assert "schema.json does not list this file" in message and "leave it out of the glob" in message


@pytest.mark.parametrize("batch_size", ["4", 2.0, True])
def test_a_batch_size_that_is_not_an_int_is_a_type_error_naming_it(shards_dir, batch_size):
    with pytest.raises(TypeError, match=r"^batch_size is .*; pass an int"):
        melshards.dataset(str(shards_dir / "train-*.tfrecord"), batch_size)
    with pytest.raises(TypeError, match=r"^batch_size is "):
        melshards.bucket_datasets(str(shards_dir / "train-*.tfrecord"), batch_size)


def test_normalizer_of_something_not_a_schema_is_a_type_error_naming_the_argument(shards_dir):
    with pytest.raises(
        TypeError,
        match=r"normalizer\(schema\): schema is 'x' \(str\), not a Schema; "
        r"pass melshards.read_schema",
    ):
        melshards.normalizer("x")


def test_dataset_gives_speaker_and_language_ids_and_balances_speakers(shards_dir, tmp_path):
    from benchmarks.shards_fixture import relabel

    plain = next(iter(melshards.dataset(str(shards_dir / "train-*.tfrecord"), 4)))
    assert plain["speaker_id"].shape == plain["language_id"].shape == (4,)  # the default features hold them
    # every 5th record by a second speaker: 20% of the records, 50% of a stream balanced at alpha 0
    two = relabel(shards_dir, tmp_path / "two", lambda i: int(i % 5 == 4), lambda i: 0, ("a", "b"), ("en",))
    ds = melshards.dataset(
        str(two / "train-*.tfrecord"), 8, balance="speaker", balance_alpha=0.0, features=("speaker_id",)
    )
    ids = np.concatenate([b["speaker_id"].numpy() for b in ds.take(250)])
    assert abs((ids == 1).mean() - 0.5) < 0.04, (ids == 1).mean()
    with pytest.raises(ValueError, match="balance is 'gender'; pass one of none, speaker, language"):
        melshards.dataset(str(two / "train-*.tfrecord"), 8, balance="gender")
    with pytest.raises(ValueError, match="balance_alpha is 2; pass a number from 0"):
        melshards.dataset(str(two / "train-*.tfrecord"), 8, balance="speaker", balance_alpha=2)


def test_a_shard_cut_at_a_record_boundary_is_an_input_error_naming_it_before_reading(shards_dir, tmp_path):
    import shutil

    from melshards.shards_schema.shards import InputError
    from tests.train.test_bad_input import cut_after_records

    run = tmp_path / "run"
    shutil.copytree(shards_dir, run)
    shard = next(run.glob("train-*.tfrecord"))
    cut_after_records(shard, 3)
    with pytest.raises(InputError, match=rf"{shard}: holds \d+ bytes, schema.json lists \d+"):
        melshards.dataset(str(run / "train-*.tfrecord"), 2)


def test_one_feature_may_be_a_str_and_globs_may_be_paths(shards_dir):
    import pathlib

    ds = melshards.dataset(pathlib.Path(shards_dir) / "train-*.tfrecord", 2, features="mel", repeat=False)
    assert list(ds.element_spec) == ["mel"]
    both = melshards.dataset(
        [shards_dir / "train-*.tfrecord", str(shards_dir / "val-*.tfrecord")],
        2,
        features=("speaker_id",),
        schema_path=pathlib.Path(shards_dir) / "schema.json",
    )
    assert list(both.element_spec) == ["speaker_id"]


def test_no_globs_or_a_glob_of_another_type_is_refused_in_one_line(shards_dir):
    from melshards.shards_schema.shards import InputError

    with pytest.raises(InputError, match=r"^no shard globs given; pass at least one, e.g. 'DIR/train-\*.tfrecord'$"):
        melshards.dataset([], 2)
    with pytest.raises(TypeError, match=r"patterns holds 3 \(int\); pass shard globs as str or pathlib.Path"):
        melshards.dataset([str(shards_dir / "train-*.tfrecord"), 3], 2)


def test_a_speaker_id_out_of_range_in_normalizer_pitch_names_the_range(shards_dir):
    import dataclasses

    import tensorflow as tf

    schema = melshards.read_schema(shards_dir)
    n = len(schema.speakers)
    schema = dataclasses.replace(schema, feature_stats={"pitch": {"mean": 150.0, "std": 30.0, "frames": 100}})
    norm = melshards.normalizer(schema)
    pitch = tf.fill([2, 4], 180.0)
    assert norm.pitch(pitch, tf.constant([0, n - 1])).numpy() == pytest.approx(1.0)
    with pytest.raises(
        ValueError, match=rf"^speaker_id {n + 4} is outside 0..{n - 1} \(schema.json has {n} speakers\)"
    ):
        norm.pitch(pitch, tf.constant([0, n + 4]))
    in_graph = tf.function(lambda p, s: norm.pitch(p, s))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"speaker_id outside 0..{n - 1}"):
        in_graph(pitch, tf.constant([-1, 0]))


def test_a_batch_larger_than_the_records_is_refused_as_the_trainer_refuses_it(shards_dir, bucketed_dir):
    """40 training records: a batch of 41 would repeat records (shuffled, repeated) or give nothing (one
    pass); the trainer's check refuses it, naming the counts. 40 reads each record once."""
    from melshards.train.buckets import BatchError

    glob = str(shards_dir / "train-*.tfrecord")
    assert melshards.read_schema(shards_dir).counts["train"] == 40
    expected = (
        r"^batch_size 41 is more than the records \(the shards hold 40\): a batch never holds a record twice, "
        r"so the largest batch that fits is 40: pass batch_size=40 or less, or add shards$"
    )
    for repeat in (True, False):
        with pytest.raises(BatchError, match=expected):
            melshards.dataset(glob, 41, repeat=repeat)
    with pytest.raises(BatchError, match=expected):
        melshards.bucket_datasets(glob, 41)
    (batch,) = list(melshards.dataset(glob, 40, repeat=False, features=("id",)))
    assert len(set(batch["id"].numpy().tolist())) == 40
    # several buckets: each one read is checked; one bucket asked for is checked alone
    schema = melshards.read_schema(bucketed_dir)
    counts = [b.counts["train"] for b in schema.buckets]
    small, large = counts.index(min(counts)), counts.index(max(counts))
    bglob = str(bucketed_dir / "train-*.tfrecord")
    with pytest.raises(
        BatchError, match=rf"bucket {small} has {counts[small]}.* largest batch that fits is {min(counts)}"
    ):
        melshards.dataset(bglob, max(counts))
    assert melshards.dataset(bglob, max(counts), bucket=large).element_spec["mel"].shape[0] == max(counts)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"features": []}, ValueError, r"^features is empty, so the records would give nothing; pass the fields"),
        ({"features": {"mel": 1}}, TypeError, r"^features is \{'mel': 1\} \(dict\); pass record field names, e\.g\."),
        ({"features": ["mel", 2]}, TypeError, r"^features holds 2 \(int\); pass record field names"),
    ],
)
def test_features_that_name_no_field_are_refused_saying_what_to_pass(shards_dir, kwargs, error, message):
    with pytest.raises(error, match=message):
        melshards.dataset(str(shards_dir / "train-*.tfrecord"), 2, **kwargs)


def test_a_dict_as_patterns_is_refused_not_read_as_its_keys(shards_dir):
    with pytest.raises(TypeError, match=r"^patterns is a dict; pass shard globs as a str, a pathlib.Path or a list"):
        melshards.dataset({str(shards_dir / "train-*.tfrecord"): "train"}, 2)


def test_normalizer_of_mel_with_other_bins_or_integers_says_what_to_pass(shards_dir):
    import tensorflow as tf

    schema = melshards.read_schema(shards_dir)
    norm = melshards.normalizer(schema)
    assert schema.n_mels == 80
    wrong = tf.zeros([2, 10, 40])
    bins = r"mel has 40 bins in its last axis, and this schema's log-mel has 80; pass log-mel \[\.\.\., 80\]"
    with pytest.raises(ValueError, match=rf"^normalizer\(mel\): {bins}"):
        norm(wrong)
    with pytest.raises(ValueError, match=rf"^normalizer\.invert\(mel\): {bins}"):
        norm.invert(wrong)
    with pytest.raises(ValueError, match=bins):  # as it is traced
        tf.function(norm)(wrong)
    with pytest.raises(ValueError, match=r"^normalizer\(mel\): mel is int32; pass log-mel as floats"):
        norm(tf.zeros([2, 10, 80], tf.int32))
