"""What a checkpoint's input position costs: the bytes of each bucket's saved tf.data iterator state, by the
stage of the chain that holds them, and the time to write it, to read it whole (the resume's check of the
newest checkpoint) and to restore it; this checkout, or it against another (`--before DIR`), side by side.

Per tree and round, in a child process of that tree: every bucket's train input built as the trainer builds
it (`trainer_buckets`, the bucket's batch, `input_pipeline.train_dataset`, the model's inputs) on
`compile_wall`'s 8-bucket shards, `--batches` batches taken from each, then the 8 iterators written in one
`tf.train.Checkpoint` (median of 5 writes), checked with `checkpoints.checkpoint_problem` (median of 5) and
restored into fresh iterators (median of 3; built apart); the stages are read from the names in the saved state
(shuffle buffer, interleave, and the rest: the parsed batches held ahead); the iterate-only records/s of
bucket 0. Trees alternate per round, so both see the same load.

Run: python -m benchmarks.train.iterator_state [--before DIR] [--rounds 2] [--batches 21] [--shards DIR]
(needs `python -m benchmarks.train.compile_wall` run first, for its shards)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import emit
from benchmarks.shards_fixture import REPO
from benchmarks.train.step_device import WORK

SHARDS = WORK / "compile-wall" / "shards-8"


def stage_of(name: str) -> str:
    """The stage a saved state's entry belongs to, from its iterator name (Iterator::Root::Prefetch::...)."""
    name = name.split("@@")[0].split("|")[-1]
    if "Shuffle" in name and ":buffer" in name:
        return "shuffle_buffer"
    if "Interleave" in name:
        return "interleave"
    return "parsed"


def state_bytes(iterator) -> dict[str, int]:
    """Bytes of `iterator`'s serialized state by stage (tf.data writes one entry per buffered element)."""
    import tensorflow as tf
    from google.protobuf.internal.decoder import _DecodeVarint  # the length prefixes of a variant list
    from tensorflow.core.framework import tensor_pb2

    state = tf.raw_ops.SerializeIterator(resource_handle=iterator._iterator_resource)
    proto = tensor_pb2.TensorProto.FromString(tf.io.serialize_tensor(state).numpy())
    data, pos, sizes = proto.tensor_content, 0, []
    for _ in range(state.shape[0]):
        n, pos = _DecodeVarint(data, pos)
        sizes.append(n)
    out: dict[str, int] = {}
    for n in sizes:
        entry = tensor_pb2.VariantTensorDataProto.FromString(data[pos : pos + n])
        pos += n
        stage = stage_of(entry.metadata.decode("latin-1"))
        out[stage] = out.get(stage, 0) + n
    return out


def measure(shards: Path, batches: int, work: Path) -> dict:
    """This process's tree: the figures of one round (run in a child process of the tree)."""
    import time

    import tensorflow as tf

    from melshards.shards_schema import read_schema
    from melshards.train import input_pipeline
    from melshards.train.buckets import trainer_buckets
    from melshards.train.checkpoints import checkpoint_problem
    from melshards.train.config import DataConfig
    from melshards.train.contract import MODEL_INPUTS

    schema = read_schema(str(shards))
    files = sorted(str(p) for p in shards.glob("train-*.tfrecord"))
    buckets = trainer_buckets(files, [], schema, DataConfig().batch_size, False, 1)

    def build():
        return {
            tb.index: iter(
                input_pipeline.train_dataset(tb.files, tb.bucket, tb.data_config(DataConfig()), MODEL_INPUTS, 1)
            )
            for tb in buckets
        }

    iterators = build()
    for it in iterators.values():
        for _ in range(batches):
            next(it)
    time.sleep(1.0)  # the buffers ahead fill
    saved = tf.Module()
    for i, it in iterators.items():
        setattr(saved, f"bucket_{i:02d}", it)
    by_bucket = {f"bucket_{i:02d}": state_bytes(it) for i, it in iterators.items()}
    prefix = str(work / f"ckpt-{os.getpid()}")

    def timed(fn, n):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return round(statistics.median(times), 3)

    write = timed(lambda: tf.train.Checkpoint(iterator=saved).write(prefix), 5)
    size = sum(p.stat().st_size for p in work.glob(f"ckpt-{os.getpid()}.*"))
    check = timed(lambda: checkpoint_problem(prefix), 5)

    def restore():
        fresh = tf.Module()
        for i, it in build().items():
            setattr(fresh, f"bucket_{i:02d}", it)
        t = time.perf_counter()
        tf.train.Checkpoint(iterator=fresh).read(prefix).assert_consumed()
        restored.append(time.perf_counter() - t)

    restored: list[float] = []
    build_and_restore = timed(restore, 3)
    restore_s = round(statistics.median(restored), 3)
    it = iterators[buckets[0].index]
    t = time.perf_counter()
    for _ in range(100):
        next(it)
    rate = 100 * buckets[0].batch_size / (time.perf_counter() - t)
    for p in work.glob(f"ckpt-{os.getpid()}.*"):
        p.unlink()
    stages = {s: sum(b.get(s, 0) for b in by_bucket.values()) for s in ("shuffle_buffer", "interleave", "parsed")}
    return {
        "checkpoint_bytes": size,
        "state_bytes": stages,
        "state_bytes_per_bucket": {k: sum(v.values()) for k, v in by_bucket.items()},
        "parsed_bytes_per_bucket": {k: v.get("parsed", 0) for k, v in by_bucket.items()},
        "write_s": write,
        "check_s": check,
        "restore_s": restore_s,
        "build_and_restore_s": build_and_restore,
        "bucket0_records_per_s": round(rate),
    }


def run_tree(tree: Path, args) -> dict:
    """One round of `measure` in a child process of `tree` (its own code on its PYTHONPATH; this file run as a
    script, so a tree without it can be measured)."""
    cmd = [sys.executable, __file__, "--child", "--batches", str(args.batches)]
    cmd += ["--shards", str(args.shards), "--work", str(args.work)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="another checkout to compare (e.g. a git worktree of an older commit)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=21, help="batches taken from each bucket before the save")
    ap.add_argument("--shards", type=Path, default=SHARDS)
    ap.add_argument("--work", type=Path, default=WORK / "iterator-state")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(measure(args.shards, args.batches, args.work)))
        return {}
    if not (args.shards / "schema.json").exists():
        raise SystemExit(f"{args.shards} holds no shards: run python -m benchmarks.train.compile_wall first")
    trees = {"this": REPO, **({"before": Path(args.before)} if args.before else {})}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            m = run_tree(tree, args)
            runs[name].append(m)
            print(
                f"round {r + 1} {name:6s} {m['checkpoint_bytes'] / 1e6:6.1f} MB (shuffle buffers "
                f"{m['state_bytes']['shuffle_buffer'] / 1e6:.1f}, parsed {m['state_bytes']['parsed'] / 1e6:.1f}, "
                f"interleave {m['state_bytes']['interleave'] / 1e6:.1f})  write {m['write_s']:.3f} s  check "
                f"{m['check_s']:.3f} s  restore {m['restore_s']:.3f} s  bucket 0 {m['bucket0_records_per_s']} records/s",
                flush=True,
            )
    result = {"benchmark": "iterator_state", "rounds": args.rounds, "batches": args.batches}
    for name, ms in runs.items():
        for key in ("checkpoint_bytes", "write_s", "check_s", "restore_s", "bucket0_records_per_s"):
            result[f"{name}_{key}_median"] = statistics.median(m[key] for m in ms)
        result[f"{name}_state_bytes"] = ms[-1]["state_bytes"]
        result[f"{name}_state_bytes_per_bucket"] = ms[-1]["state_bytes_per_bucket"]
        result[f"{name}_parsed_bytes_per_bucket"] = ms[-1]["parsed_bytes_per_bucket"]
    emit(result)
    return result


if __name__ == "__main__":
    main()
