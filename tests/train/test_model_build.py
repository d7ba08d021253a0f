"""The built-in model creates its variables with Keras's `build`, without running the network, and
they are the variables a first call would create: same order, structure, checkpoint keys and initial
values under the same seed (a fresh run's losses and every checkpoint depend on them)."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from melshards.shards_schema import read_schema
from melshards.shards_schema.config import from_dict
from melshards.train import model as model_module
from melshards.train.config import ModelConfig
from melshards.train.model import Conditioning, TextToMel, TransformerBlock, build_text_to_mel
from tests.train.conftest import TEST_CONFIG

SEED = 7


def _built_by_its_first_call(cfg, schema, precision: str) -> TextToMel:
    """The model as Keras builds a layer without its own `build`: every sublayer creates its variables
    when the first call reaches it (the order that call uses them in)."""
    with pytest.MonkeyPatch.context() as mp:
        for cls in (TextToMel, TransformerBlock, Conditioning):
            mp.setattr(cls, "build", lambda self, input_shape: None)
        model = build_text_to_mel(cfg, schema, precision)  # its build() a no-op here: nothing built yet
        ids = tf.zeros([1], tf.int32)
        frames = cfg.reduction_factor
        model(tf.zeros([1, 3], tf.int32), tf.ones([1], tf.int32), ids, ids, tf.zeros([1, frames, schema.n_mels]), ids)
    return model


def _checkpoint_keys(model, path) -> list[str]:
    return [name for name, _ in tf.train.list_variables(tf.train.Checkpoint(model=model).write(str(path)))]


@pytest.mark.parametrize(
    ("options", "precision"),
    [
        ({}, "float32"),
        ({"speaker_dim": 0, "encoder_layers": 2, "decoder_layers": 2, "postnet_layers": 2}, "mixed_bfloat16"),
        ({"speaker_dim": 0, "language_dim": 0, "encoder_conv_layers": 0, "postnet_layers": 0}, "float32"),
    ],
)
def test_the_built_model_holds_the_variables_and_initial_values_its_first_call_would_create(
    options, precision, shards_dir, tmp_path
):
    schema = read_schema(str(shards_dir))
    cfg = from_dict(ModelConfig, {**TEST_CONFIG["model"], **options}, where="model options", prefix="model.")
    keras.utils.set_random_seed(SEED)
    called = _built_by_its_first_call(cfg, schema, precision)
    keras.utils.set_random_seed(SEED)
    built = build_text_to_mel(cfg, schema, precision)

    def unnumbered(path: str) -> str:  # Keras numbers layer names per process: a second model's differ
        return re.sub(r"_\d+(?=/|$)", "", path)

    assert [(unnumbered(v.path), v.dtype, tuple(v.shape)) for v in built.variables] == [
        (unnumbered(v.path), v.dtype, tuple(v.shape)) for v in called.variables
    ]
    for b, c in zip(built.variables, called.variables, strict=True):
        np.testing.assert_array_equal(b.numpy(), c.numpy(), err_msg=b.path)
    assert _checkpoint_keys(built, tmp_path / "built") == _checkpoint_keys(called, tmp_path / "called")


def test_the_builtin_factory_creates_the_variables_without_running_the_model(shards_dir, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("the factory ran the model")

    monkeypatch.setattr(TextToMel, "call", refuse)
    model = model_module.build(read_schema(str(shards_dir)), TEST_CONFIG["model"])
    assert model.built and len(model.trainable_variables) > 60
