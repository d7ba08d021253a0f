"""The built-in model's graph (train/model.py): its layers compute what Keras's and TensorFlow's own
ops do, with fewer graph nodes in the step's gradient and few ops that tf2xla lowers through its MLIR
bridge."""

from __future__ import annotations

import numpy as np
from keras import layers

from melshards.shards_schema import read_schema
from melshards.train.config import OptimConfig
from melshards.train.model import Dense, Dropout, SiteKeys, attend, relu
from melshards.train.native_ops import MLIR_LOWERED
from melshards.train.plugins import build_model
from melshards.train.step import make_optimizer, make_train_step, step_specs
from melshards.train.tf_quiet import tf  # noqa: I001
from tests.train.conftest import TEST_CONFIG

# what the built-in train step still lowers through tf2xla's MLIR bridge, and why (train/native_ops.py)
MLIR_LOWERED_KEPT = {
    "Rsqrt": "the layer norms' and the learning-rate schedule's: the native kernels that build XLA's rsqrt"
    " (FusedBatchNormV3, FusedBatchNormGradV3) lower no faster (benchmarks/train/lowering.py --ops)",
    "Exp": "the stop loss's log1p(exp(-|z|)): no native kernel builds XLA's exp of a tensor alone",
    "Sqrt": "the gradients' global norm: no native kernel builds XLA's sqrt",
    "Tanh": "the postnet's activation: no native kernel builds XLA's tanh",
}


def _count(graph, op_type: str) -> int:
    return sum(op.type == op_type for op in graph.get_operations())


def _value_and_gradients(f, sources, dy):
    """f's value and the gradients of <f, dy> with respect to sources, in one traced function."""

    @tf.function(autograph=False)
    def run():
        with tf.GradientTape() as tape:
            tape.watch([s for s in sources if isinstance(s, tf.Tensor)])
            y = f()
        return y, tape.gradient(y, sources, output_gradients=dy)

    return run


def test_dropouts_gradient_is_tensorflows_own_without_the_constant_divisors_gradient():
    x, dy = tf.random.stateless_normal([4, 16, 8], [1, 2]), tf.random.stateless_normal([4, 16, 8], [3, 4])
    seed, layer = tf.constant([7, 3], tf.int32), Dropout(0.3, site=5, rng="philox")
    keep = SiteKeys(seed).uniform(tf.shape(x), 5, "philox") >= 0.3
    ours = _value_and_gradients(lambda: layer(x, seed, training=True), [x], dy)
    theirs = _value_and_gradients(lambda: tf.where(keep, x / tf.cast(0.7, x.dtype), tf.zeros_like(x)), [x], dy)
    (y, [dx]), (want_y, [want_dx]) = ours(), theirs()
    np.testing.assert_array_equal(y.numpy(), want_y.numpy())
    np.testing.assert_array_equal(dx.numpy(), want_dx.numpy())
    # x / scale forward and dy / scale backward; no gradient for the divisor (two more divisions)
    assert _count(ours.get_concrete_function().graph, "RealDiv") == 2


def test_attend_is_keras_multi_head_attention_on_its_variables():
    mha = layers.MultiHeadAttention(2, 4)
    query, value = tf.random.stateless_normal([3, 5, 8], [1, 2]), tf.random.stateless_normal([3, 7, 8], [3, 4])
    mha.build(query.shape, value.shape)
    mask = tf.random.stateless_uniform([3, 5, 7], [5, 6]) > 0.3
    causal = tf.constant(np.tril(np.ones((5, 5), bool)))
    dy = tf.random.stateless_normal([3, 5, 8], [7, 8])
    sources = [query, value, *mha.trainable_variables]
    for ours, keras_own in [
        (lambda: attend(mha, query, value, mask[:, None]), lambda: mha(query, value, attention_mask=mask)),
        (lambda: attend(mha, query, query, causal), lambda: mha(query, query, use_causal_mask=True)),
    ]:
        (y, grads), (want_y, want_grads) = (
            _value_and_gradients(ours, sources, dy)(),
            _value_and_gradients(keras_own, sources, dy)(),
        )
        np.testing.assert_allclose(y.numpy(), want_y.numpy(), rtol=1e-6, atol=1e-6)
        for g, want in zip(grads, want_grads):
            assert (g is None) == (want is None)  # value: unused by self-attention
            if want is not None:
                np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_dense_with_relu_is_kerass_without_the_ops_lowered_through_mlir():
    """`Dense` and `relu` give Keras's Dense(activation="relu") values and gradients on the same
    variables, with no Relu, ReluGrad, BiasAdd or BiasAddGrad in the graph."""
    x = tf.nn.relu(tf.random.stateless_normal([4, 6, 8], [1, 2]))  # exact zeros: relu's edge
    ours, keras_own = Dense(5, activation=relu), layers.Dense(5, activation="relu")
    ours.build(x.shape), keras_own.build(x.shape)
    keras_own.set_weights([np.ones([8, 5], np.float32) * 0.1, -np.arange(5, dtype=np.float32) * 0.1])
    ours.set_weights(keras_own.get_weights())
    dy = tf.random.stateless_normal([4, 6, 5], [3, 4])
    run = _value_and_gradients(lambda: ours(x), [x, ours.kernel, ours.bias], dy)
    (y, grads), (want_y, want_grads) = (
        run(),
        _value_and_gradients(lambda: keras_own(x), [x, keras_own.kernel, keras_own.bias], dy)(),
    )
    np.testing.assert_array_equal(y.numpy(), want_y.numpy())
    for g, want in zip(grads, want_grads):
        np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    graph = run.get_concrete_function().graph
    assert not {"Relu", "ReluGrad", "BiasAdd", "BiasAddGrad"} & {op.type for op in graph.get_operations()}


def _op_types(graph_def) -> list[str]:
    """The op of every node of a graph and of every function in its library."""
    return [n.op for n in graph_def.node] + [n.op for f in graph_def.library.function for n in f.node_def]


def test_the_built_in_train_step_lowers_few_ops_through_mlir(shards_dir):
    """The whole XLA train step (forward, gradient, clip, optimizer): no Einsum, Relu or BiasAdd, the
    attention's products MatMuls and its projections rank-2 MatMuls (no BatchMatMulV2 broadcasting a
    kernel over the batch), and of the ops TensorFlow lowers to XLA through its MLIR bridge one op at a
    time only those no native formulation reproduces bit for bit (MLIR_LOWERED_KEPT)."""
    schema = read_schema(str(shards_dir))
    model, loss_names = build_model("melshards.train.model:build", schema, dict(TEST_CONFIG["model"], dropout=0.1))
    cfg = OptimConfig()
    specs = step_specs(schema.largest, 2)
    step = make_train_step(
        model, make_optimizer(cfg, "float32", model), schema, cfg, specs, 1, 0, tf.Variable(0, tf.int64), loss_names
    )
    graph = step.get_concrete_function().graph
    ops = _op_types(graph.as_graph_def())
    assert {op for op in ops if op in MLIR_LOWERED} == set(MLIR_LOWERED_KEPT)
    assert not {"Einsum", "Relu", "ReluGrad", "BiasAdd", "BiasAddGrad"} & set(ops)
    batched = [op for op in graph.get_operations() if op.type == "BatchMatMulV2"]
    assert batched and all(t.shape.rank == 4 for op in batched for t in op.inputs)
