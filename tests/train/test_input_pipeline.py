"""The input pipeline: pure TF ops, the schema's static shapes, every validation record exactly once."""
from __future__ import annotations

import tensorflow as tf

from train import input_pipeline as ip
from train.config import DataConfig
from tests.train.conftest import ids_in, real_ids
from train.step import MODEL_INPUTS


def _inputs(shards_dir, split):
    files = ip.expand_globs([str(shards_dir / f"{split}-*.tfrecord")])
    schema, _ = ip.check_schemas(files, None)
    return files, schema


def test_dataset_graph_has_no_python_ops(shards_dir):
    files, schema = _inputs(shards_dir, "train")
    train = ip.train_dataset(files, schema, DataConfig(batch_size=4), MODEL_INPUTS, steps_per_execution=2)
    val = ip.val_dataset(_inputs(shards_dir, "val")[0], schema, DataConfig(batch_size=4), MODEL_INPUTS)
    assert ip.python_ops_in(train) == []
    assert ip.python_ops_in(val) == []


def test_python_op_detector_finds_a_py_function_inside_a_map(shards_dir):
    files, schema = _inputs(shards_dir, "train")
    ds = ip.train_dataset(files, schema, DataConfig(batch_size=4), MODEL_INPUTS, 1)
    ds = ds.map(lambda b: tf.py_function(lambda x: x, [b["mel_len"]], tf.int32))
    assert ip.python_ops_in(ds) == ["EagerPyFunc"]


def test_train_batches_have_the_schema_static_shapes(shards_dir):
    files, schema = _inputs(shards_dir, "train")
    ds = ip.train_dataset(files, schema, DataConfig(batch_size=4), MODEL_INPUTS, steps_per_execution=3)
    for name in MODEL_INPUTS:
        f = schema.feature(name)
        assert ds.element_spec[name].shape.as_list() == [3, 4, *f.shape]
        assert ds.element_spec[name].dtype == tf.as_dtype(f.dtype)
    batch = next(iter(ds))
    assert batch["mel"].shape == (3, 4, schema.max_mel_frames, schema.n_mels)


def test_validation_pass_sees_every_record_once_and_pads_the_last_batch(shards_dir):
    files, schema = _inputs(shards_dir, "val")
    batches = list(ip.val_dataset(files, schema, DataConfig(batch_size=3), (*MODEL_INPUTS, "id")))
    expected = ids_in(files)
    assert len(set(expected)) == len(expected) == schema.counts["val"] > 3  # distinct ids, more than a batch
    assert sorted(real_ids(batches)) == sorted(expected)  # each record once: none missing, none repeated
    lens = tf.concat([b["mel_len"] for b in batches], 0).numpy()
    assert all(b["mel"].shape[0] == 3 for b in batches)
    assert len(lens) % 3 == 0 and (lens[schema.counts["val"]:] == 0).all()
