"""What lowering a train step to HLO costs (a resumed run's lookup in the persistent XLA cache), by op.

Default: one bucket's train step of the built-in model (in --precision's policy, float32 by default),
traced once per model file (this checkout's train/model.py, and with --before DIR that tree's
train/model.py, loaded as a plug-in factory into this checkout's trainer, so only the model differs),
then lowered to HLO (`experimental_get_compiler_ir(...)
(stage="hlo")`) --reps times per model, alternating, in one process. Reported per model: the graph's
nodes by first name component, the ops tf2xla lowers through its MLIR bridge (`MLIR_LOWERED`,
train/native_ops.py), and the lowering's CPU seconds (median, min).

--ops: the lowering's CPU milliseconds per op of each type: a jit-compiled function of 40 copies of one
op against 40 of Neg, alternating, median of --reps; "native x" is train/native_ops.py's x, with its
gradient where it has one (the gradient's ops as well as the forward's).

Run: python -m benchmarks.train.lowering --shards DIR --config YAML [--bucket 5] [--before DIR] [--reps 8]
     [--precision mixed_float16]
     python -m benchmarks.train.lowering --ops [--reps 5]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import yaml

from melshards.train import native_ops
from melshards.train.native_ops import MLIR_LOWERED
from melshards.train.tf_quiet import tf  # noqa: I001


def _cpu(f) -> float:
    start = time.process_time()
    f()
    return time.process_time() - start


def _with_gradient(op, t):
    """op(t) plus its gradient with respect to t (one sum, so both are lowered)."""
    with tf.GradientTape() as tape:
        tape.watch(t)
        y = op(t)
    return y + tape.gradient(y, t)


def _batch_norm_rsqrt(t):
    """rsqrt(t) as FusedBatchNormGradV3's input gradient in inference mode, y_backprop * (rsqrt(variance +
    epsilon) * scale) with ones for y_backprop and scale and zero epsilon: XLA folds it to rsqrt(t), bit
    for bit (a formulation without Rsqrt, measured against it)."""
    n = t.shape.num_elements()
    ones, zeros = tf.ones([n]), tf.zeros([n])
    grads = tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=tf.reshape(ones, [1, 1, 1, n]),
        x=tf.reshape(ones, [1, 1, 1, n]),
        scale=ones,
        reserve_space_1=zeros,
        reserve_space_2=tf.reshape(t, [n]),
        reserve_space_3=zeros,
        epsilon=0.0,
        is_training=False,
    )
    return tf.reshape(grads[0], t.shape)


def op_costs(reps: int) -> None:
    n, x = 40, tf.ones([8, 16, 32])
    w, keep = tf.ones([32, 32]), tf.ones([8, 16, 32]) > 0
    ops = {
        "Neg": lambda t: -t,
        "AddV2": lambda t: t + 1.0,
        "SelectV2": lambda t: tf.where(keep, t, 0.0),
        "Sum": lambda t: tf.reduce_sum(t, -1, keepdims=True),
        "MatMul": lambda t: tf.reshape(tf.matmul(tf.reshape(t, [-1, 32]), w), [8, 16, 32]),
        "BatchMatMulV2": lambda t: tf.matmul(t, t, transpose_b=True),
        "Transpose": lambda t: tf.transpose(t, [0, 2, 1]),
        "BiasAdd": lambda t: tf.nn.bias_add(t, tf.ones([32])),
        "Einsum": lambda t: tf.einsum("btd,bsd->bts", t, t),
        "BiasAddGrad": lambda t: tf.raw_ops.BiasAddGrad(out_backprop=t),
        "Relu": tf.nn.relu,
        "ReluGrad": lambda t: tf.raw_ops.ReluGrad(gradients=t, features=t),
        "Rsqrt": tf.math.rsqrt,
        "Softmax": tf.nn.softmax,
        "Abs": tf.abs,
        "Exp": tf.exp,
        "Sqrt": tf.sqrt,
        "Tanh": tf.tanh,
        "FusedBatchNormGradV3 as rsqrt": _batch_norm_rsqrt,
        "Softmax+grad": lambda t: _with_gradient(tf.nn.softmax, t),
        "native softmax+grad": lambda t: _with_gradient(native_ops.softmax, t),
        "Abs+grad": lambda t: _with_gradient(tf.abs, t),
        "native abs+grad": lambda t: _with_gradient(native_ops.absolute, t),
        "Log1p+grad": lambda t: _with_gradient(tf.math.log1p, t),
        "native log1p+grad": lambda t: _with_gradient(native_ops.log1p, t),
        "IsFinite": lambda t: tf.cast(tf.math.is_finite(t), t.dtype),
        "native is_finite": lambda t: tf.cast(native_ops.is_finite(t), t.dtype),
    }

    def many(op):
        return tf.function(lambda t: [tf.reduce_sum(op(t + float(k))) for k in range(n)], jit_compile=True)

    fns = {name: many(op) for name, op in ops.items()}
    for f in fns.values():
        f.experimental_get_compiler_ir(x)(stage="hlo")
    cpu = collections.defaultdict(list)
    for _ in range(reps):
        for name, f in fns.items():
            cpu[name].append(_cpu(lambda f=f: f.experimental_get_compiler_ir(x)(stage="hlo")))
    base = statistics.median(cpu["Neg"])
    for name, xs in cpu.items():
        print(f"{name:14s} {(statistics.median(xs) - base) / n * 1000:6.2f} ms per op more than Neg")


def step_costs(shards: str, config: str, bucket: int, models: list[str], reps: int, precision: str) -> None:
    from melshards.shards_schema.schema import read_schema
    from melshards.train.config import OptimConfig
    from melshards.train.plugins import build_model
    from melshards.train.step import make_optimizer, make_train_step, step_specs

    schema = read_schema(shards)
    options = yaml.safe_load(Path(config).read_text())["model"]
    specs = step_specs(schema.buckets[min(bucket, len(schema.buckets) - 1)], 8)
    batch = {k: tf.zeros([1, *s.shape], s.dtype) for k, s in specs.items()}
    steps = {}
    for i, path in enumerate(models):
        name = f"lowering_model_{i}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        model, loss_names = build_model(f"{name}:build", schema, dict(options), precision)
        cfg = OptimConfig()
        fn = make_train_step(
            model, make_optimizer(cfg, precision, model), schema, cfg, specs, 1, 0, tf.Variable(0, tf.int64), loss_names
        )
        nodes = fn.get_concrete_function().graph.as_graph_def().node
        groups = collections.Counter("(top)" if "/" not in n.name else n.name.split("/")[0] for n in nodes)
        mlir = collections.Counter(n.op for n in nodes if n.op in MLIR_LOWERED)
        print(path, "nodes", len(nodes), dict(groups.most_common(5)))
        print(path, "MLIR-lowered ops", sum(mlir.values()), dict(sorted(mlir.items())))
        steps[path] = fn
    cpu = collections.defaultdict(list)
    for _ in range(reps):
        for path, fn in steps.items():
            cpu[path].append(_cpu(lambda fn=fn: fn.experimental_get_compiler_ir(batch)(stage="hlo")))
    for path, xs in cpu.items():
        print(path, f"lowering CPU s: median {statistics.median(xs):.3f}, min {min(xs):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", action="store_true")
    parser.add_argument("--shards")
    parser.add_argument("--config")
    parser.add_argument("--bucket", type=int, default=5)
    parser.add_argument("--before")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--precision", default="float32", help="float32 | mixed_float16 | mixed_bfloat16")
    args = parser.parse_args()
    if args.ops:
        return op_costs(args.reps)
    if not (args.shards and args.config):
        parser.error("--shards and --config are required without --ops")
    models = [str(Path(__file__).resolve().parents[2] / "train" / "model.py")]
    if args.before:
        models.insert(0, str(Path(args.before) / "train" / "model.py"))
    step_costs(args.shards, args.config, args.bucket, models, args.reps, args.precision)


if __name__ == "__main__":
    main()
