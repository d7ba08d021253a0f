"""Per-device layer choices (train/device.py): each pair computes the same thing on this CPU."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from melshards.shards_schema import read_schema
from melshards.train import device
from melshards.train.model import Conv1D, Dropout, SiteKeys, same_conv
from melshards.train.plugins import build_model, zero_batch
from melshards.train.tf_quiet import tf  # noqa: I001
from tests.train.conftest import TEST_CONFIG


def test_this_machine_compiles_for_cpu_and_gets_im2col_and_threefry():
    assert device.step_device() == "CPU"
    assert device.current() == device.Choices("CPU", "im2col", "threefry")


def test_gpu_and_tpu_get_the_native_conv():
    assert device.choices_for("GPU") == device.Choices("GPU", "native", "philox")
    assert device.choices_for("TPU").conv == "native"
    with pytest.raises(ValueError, match="one of CPU, GPU, TPU"):
        device.choices_for("NPU")


def test_a_strategy_on_cpu_devices_compiles_for_cpu():
    assert device.step_device(tf.distribute.OneDeviceStrategy("/cpu:0")) == "CPU"


@pytest.mark.parametrize("kernel", [1, 3, 4, 5])
def test_native_and_im2col_conv_give_the_same_outputs_and_gradients(kernel):
    x = tf.random.stateless_normal([3, 17, 6], seed=[1, kernel])
    dense = keras.layers.Dense(5, activation="tanh")
    outs, grads = {}, {}
    for impl in ("im2col", "native"):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = same_conv(x, dense, kernel, impl)
            loss = tf.reduce_sum(y * tf.range(5, dtype=tf.float32))
        outs[impl] = y.numpy()
        grads[impl] = [g.numpy() for g in tape.gradient(loss, [x, *dense.trainable_variables])]
    np.testing.assert_allclose(outs["native"], outs["im2col"], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads["native"], grads["im2col"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_both_convs_compile_with_xla_in_bfloat16():
    x = tf.random.stateless_normal([2, 24, 8], seed=[2, 0])
    outs = {}
    for impl in ("im2col", "native"):
        layer = Conv1D(8, 5, activation="relu", impl=impl, dtype="mixed_bfloat16")
        layer(x)  # build, then give both the same weights
        layer.dense.kernel.assign(tf.reshape(tf.range(5 * 8 * 8, dtype=tf.float32) % 7 / 7 - 0.4, [40, 8]))
        outs[impl] = tf.function(layer, jit_compile=True)(tf.cast(x, tf.bfloat16))
        assert outs[impl].dtype == tf.bfloat16
    np.testing.assert_allclose(
        tf.cast(outs["native"], tf.float32), tf.cast(outs["im2col"], tf.float32), rtol=2e-2, atol=2e-2
    )


@pytest.mark.parametrize("rng", ["threefry", "philox"])
def test_each_dropout_generator_keeps_the_rate_and_the_mean(rng):
    layer = Dropout(0.3, site=5, rng=rng)
    assert layer.rng == rng
    x = tf.ones([64, 128, 32])
    seed = tf.constant([7, 3], tf.int32)
    drop = tf.function(lambda x, s, site: Dropout(0.3, site, rng=rng)(x, s, training=True), jit_compile=True)
    y = drop(x, seed, 5).numpy()  # threefry runs under XLA only, as the step does
    kept = np.mean(y != 0)
    assert abs(kept - 0.7) < 0.01
    assert abs(y.mean() - 1.0) < 0.02  # kept values are scaled by 1 / (1 - rate)
    np.testing.assert_array_equal(y, drop(x, seed, 5).numpy())  # a key draws one mask
    other = drop(x, seed, 6).numpy()
    assert np.mean((y != 0) == (other != 0)) < 0.7  # another site: an independent mask
    np.testing.assert_array_equal(layer(x, seed, training=False).numpy(), x.numpy())


def test_a_model_built_for_a_gpu_loads_cpu_weights_and_gives_the_same_losses(shards_dir):
    schema = read_schema(str(shards_dir))
    options = {k: v for k, v in TEST_CONFIG["model"].items()}
    spec = "melshards.train.model:build"
    cpu, _ = build_model(spec, schema, options, "float32", device.choices_for("CPU"))
    gpu, _ = build_model(spec, schema, options, "float32", device.choices_for("GPU"))
    assert {layer.impl for layer in cpu._flatten_layers() if isinstance(layer, Conv1D)} == {"im2col"}
    assert {layer.impl for layer in gpu._flatten_layers() if isinstance(layer, Conv1D)} == {"native"}
    assert {layer.rng for layer in gpu._flatten_layers() if isinstance(layer, Dropout)} == {"philox"}
    assert [v.shape for v in cpu.variables] == [v.shape for v in gpu.variables]
    gpu.set_weights(cpu.get_weights())  # one checkpoint layout: weights move between devices
    batch = zero_batch(schema, 2)
    rng = np.random.default_rng(0)
    batch["mel"] = tf.constant(rng.normal(size=batch["mel"].shape), tf.float32)
    batch["mel_len"] = tf.constant([batch["mel"].shape[1], 40], tf.int32)
    batch["text_ids"] = tf.constant(rng.integers(1, 20, size=batch["text_ids"].shape), tf.int32)
    batch["text_len"] = tf.constant([batch["text_ids"].shape[1], 9], tf.int32)
    key = tf.zeros([2], tf.int32)
    a = cpu.loss_terms(batch, key, training=False)
    b = gpu.loss_terms(batch, key, training=False)
    for name in a:
        np.testing.assert_allclose(float(b[name]), float(a[name]), rtol=1e-4, atol=1e-4)


def test_a_sites_key_is_the_fold_in_of_the_steps_key_and_the_site():
    """SiteKeys hashes the step's key once and each site adds its number: the key of site n is still
    stateless_fold_in(seed, n), so every site, step and replica keeps its own stream, and each generator
    draws from it the numbers tf.random.stateless_uniform draws (threefry from its own key, under XLA)."""
    draw = tf.function(
        lambda seed, site, alg: (
            SiteKeys(seed).uniform([5, 33], site, alg),
            tf.random.stateless_uniform(
                [5, 33], tf.random.experimental.stateless_fold_in(seed, site, alg="philox"), alg=alg
            ),
        ),
        jit_compile=True,
    )
    for seed in ([0, 0], [7, 3], [-5, 2**31 - 1]):
        keys = SiteKeys(tf.constant(seed, tf.int32))
        for site in (1, 2, 100, 201):
            expected = tf.random.experimental.stateless_fold_in(tf.constant(seed, tf.int32), site, alg="philox")
            np.testing.assert_array_equal(keys.site(site).numpy(), expected.numpy())
            for alg in ("threefry", "philox"):
                ours, theirs = draw(tf.constant(seed, tf.int32), site, alg)
                np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    x, seed = tf.ones([4, 16, 8]), tf.constant([7, 3], tf.int32)
    layer = Dropout(0.3, site=5, rng="philox")
    np.testing.assert_array_equal(
        layer(x, seed=SiteKeys(seed), training=True).numpy(), layer(x, seed, training=True).numpy()
    )


def test_the_built_in_model_hashes_the_steps_key_once_per_forward_pass_not_once_per_site(shards_dir):
    schema = read_schema(str(shards_dir))
    model, _ = build_model("melshards.train.model:build", schema, dict(TEST_CONFIG["model"], dropout=0.1))
    batch = zero_batch(schema, 2)
    graph = (
        tf.function(lambda seed: model.loss_terms(batch, seed, training=True), autograph=False)
        .get_concrete_function(tf.TensorSpec([2], tf.int32))
        .graph
    )
    fold_in = (
        tf.function(lambda seed: tf.random.experimental.stateless_fold_in(seed, 0, alg="philox"), autograph=False)
        .get_concrete_function(tf.TensorSpec([2], tf.int32))
        .graph
    )

    def count(g, op_type: str) -> int:
        return sum(op.type == op_type for op in g.get_operations())

    assert count(graph, "StatelessRandomUniformV2") > 3  # sites drawing a mask each
    # the hash of one philox fold-in, not one per site; each threefry draw keys from SiteKeys' halves,
    # no per-site conversion of a [2] seed (its shifts)
    for op_type in ("StatelessRandomUniformFullIntV2", "LeftShift"):
        assert count(graph, op_type) == count(fold_in, op_type) > 0
