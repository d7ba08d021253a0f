"""tf.distribute: mirrored on 3 CPU devices against one device (a replica count that does not divide 8,
validation under mirrored), two local workers joined by TF_CONFIG, preemption; and the persistent XLA cache
of the one-device runs (a resumed run loads every compiled step).

The runs train the plug-in LITE_MODEL (tests/train/conftest.py): what is tested is the strategy, the cluster,
the resume and the cache around a model, whatever the model; its steps trace and compile in a fraction of the
built-in model's time. That the built-in model's losses split exactly over replicas is checked on its own
loss functions (test_the_built_in_models_replica_losses_over_the_global_counts_add_up_to_the_global_loss).

Runs that need their own devices (--cpu-devices, TF_CONFIG) are `python -m melshards train`
subprocesses, each with the persistent XLA cache the test names; the one-device runs of one model share one,
and the resume that finds its steps in it is a new process too. The mirrored run resumed on one device
trains in this process, through the CLI entry point (`melshards.commands.train.run`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from melshards.shards_schema.config import ConfigError
from melshards.train.distribute import Topology, resume_seed, shard_plan
from melshards.train.inputs import resolve_inputs
from melshards.train.step import dropout_key
from tests.train.conftest import TEST_CONFIG, write_lite_config

# Seconds for any one run: a guard against a hung collective only, so it fails the test instead of
# hanging the suite. Generous: a mirrored run traces and compiles each bucket's pass on each replica
# device, and a slow machine is not a failure.
TIMEOUT = 1800


# -- pure pieces --------------------------------------------------------------------------------
def test_batch_size_must_divide_by_the_replicas():
    topo = Topology("mirrored", None, replicas=4)
    assert topo.per_replica_batch(8) == 2
    with pytest.raises(ConfigError, match="does not divide by the 4 replicas"):
        topo.per_replica_batch(6)


def test_an_unknown_strategy_in_the_config_is_refused(shards_dir):
    from melshards.shards_schema import read_schema
    from melshards.train.config import TrainConfig

    with pytest.raises(ConfigError, match="loop.strategy is 'gpus'; choose one of auto, one, mirrored"):
        TrainConfig().override(strategy="gpus").validate(read_schema(str(shards_dir)))


def test_the_trainer_gives_every_bucket_a_batch_the_replicas_divide(bucketed_dir):
    """3 replicas, global batch 3, all four buckets of bucketed_dir: [9, 6, 3, 3] (on one device [9, 7, 5, 3]).
    gcd(B, 8) alone, or the replicas not passed on, gave batches 7 and 5, refused after the model dir was
    written. (The mirrored run below trains bucket 0, whose batch is 9 both ways.)"""
    from melshards.train.config import config_from_dict
    from melshards.train.trainer import check_buckets

    cfg = config_from_dict(dict(TEST_CONFIG, data=dict(TEST_CONFIG["data"], batch_size=3)))
    inputs = resolve_inputs([str(bucketed_dir / "train-*.tfrecord")], [], None, cfg)
    assert [tb.batch_size for tb in check_buckets(inputs, Topology("mirrored", None, replicas=3))] == [9, 6, 3, 3]
    assert [tb.batch_size for tb in check_buckets(inputs, Topology("one", None))] == [9, 7, 5, 3]


def test_under_a_strategy_each_bucket_gets_a_distributed_input_of_its_own_files_and_shapes(bucketed_dir, tmp_path):
    """Every bucket the schedule uses gets a distributed input of its own: its own files, batch and shapes
    (each checked against its own step's specs), not another bucket's. The mirrored run below trains one
    bucket; this checks two, in-process, under MirroredStrategy on this process's CPU device: a strategy's
    steps trace at their first call, so building the Trainer traces and compiles nothing."""
    from melshards.train.config import config_from_dict
    from melshards.train.trainer import Trainer

    cfg = config_from_dict(dict(TEST_CONFIG, data=dict(TEST_CONFIG["data"], batch_size=BATCH)))
    inputs = resolve_inputs([str(bucketed_dir / "train-b0[03]-*.tfrecord")], [], None, cfg)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    trainer = Trainer(inputs, str(tmp_path / "m"), False, Topology("mirrored", strategy, replicas=1))
    trainer.start_distributed_input(0)
    used = [tb for tb in trainer.buckets if tb.index in trainer.train_steps]
    assert [(tb.index, tb.batch_size) for tb in used] == [(0, 9), (3, 3)]
    for tb in used:
        batch = strategy.experimental_local_results(next(trainer.iterators[tb.index]))[0]
        assert batch["mel"].shape[1:3] == (tb.batch_size, tb.bucket.max_mel_frames), tb.index
        lengths = batch["mel_len"].numpy()
        lengths = lengths[lengths > 0]  # real records, padding left out
        shorter = max(
            [b.max_mel_frames for b in inputs.schema.buckets if b.max_mel_frames < tb.bucket.max_mel_frames] + [0]
        )
        assert lengths.size and ((shorter < lengths) & (lengths <= tb.bucket.max_mel_frames)).all(), tb.index


def test_workers_read_whole_files_when_each_gets_one_else_records():
    assert shard_plan(files=8, pipelines=2) == "files"
    assert shard_plan(files=2, pipelines=2) == "files"
    assert shard_plan(files=1, pipelines=2) == "records"


def test_a_resumed_distributed_input_gets_a_new_seed_per_start_step():
    assert resume_seed(7, 0) == 7
    seeds = {resume_seed(7, step) for step in (0, 10, 20, 30)}
    assert len(seeds) == 4


def test_dropout_keys_differ_by_step_replica_and_site_without_the_old_collision():
    def site_key(step, replica, site):
        key = dropout_key(0, tf.constant(step, tf.int64), replica)
        return tuple(tf.random.experimental.stateless_fold_in(key, site, alg="philox").numpy())

    keys = {site_key(t, r, s) for t in range(3) for r in range(2) for s in (1, 2, 100)}
    assert len(keys) == 3 * 2 * 3
    # the old key seed + [0, 7919] * site made site 1 at step 7919 equal site 0 at step 0
    assert site_key(7919, 0, 1) != site_key(0, 0, 0)


def test_the_built_in_models_replica_losses_over_the_global_counts_add_up_to_the_global_loss(shards_dir):
    """Under a strategy each replica minimises losses_from_terms(its terms, the counts summed over all
    replicas) (train/step.py), so the replicas' gradients add up to the global loss's only if the model's
    loss_counts holds every denominator of its losses. The runs below train LITE_MODEL; this is the built-in
    model's side of it, eagerly on one batch of shards_dir split over two replicas (no dropout: training False)."""
    from melshards.shards_schema import read_schema
    from melshards.train.config import config_from_dict
    from melshards.train.contract import MODEL_INPUTS
    from melshards.train.input_pipeline import first_batch
    from melshards.train.model import build_text_to_mel

    cfg = config_from_dict(TEST_CONFIG)
    schema = read_schema(str(shards_dir / "schema.json"))
    model = build_text_to_mel(cfg.model, schema, "float32")
    batch = first_batch([str(p) for p in shards_dir.glob("train-*.tfrecord")], schema, cfg.data, MODEL_INPUTS)
    n = cfg.data.batch_size // 2
    halves = [{k: v[:n] for k, v in batch.items()}, {k: v[n:] for k, v in batch.items()}]
    seed = tf.zeros([2], tf.int32)
    counts = {k: sum(model.loss_counts(h)[k] for h in halves) for k in model.loss_counts(batch)}
    replicas = [model.losses_from_terms(dict(model.loss_terms(h, seed, False), **counts)) for h in halves]
    whole = model.losses_from_terms(model.loss_terms(batch, seed, False))
    for name, value in whole.items():
        np.testing.assert_allclose(float(replicas[0][name] + replicas[1][name]), float(value), rtol=1e-5, err_msg=name)


# -- runs -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(shards_dir, model_dir, cfg, cache, *args, env=None, train_glob="train-*.tfrecord"):
    """`melshards train` in a new process, its persistent XLA cache in `cache` (MELSHARDS_XLA_CACHE, as a user
    sets it: the product turns it into TF_XLA_FLAGS, train/xla_cache.py)."""
    env = dict(os.environ, **(env or {}), PYTHONUNBUFFERED="1", MELSHARDS_XLA_CACHE=str(cache))
    env.pop("TF_XLA_FLAGS", None)  # the test session's cache (tests/conftest.py): each run here names its own
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "melshards",
            "train",
            str(shards_dir / train_glob),
            "--model-dir",
            str(model_dir),
            "--config",
            str(cfg),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _finish(proc) -> str:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired as timeout:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("run timed out:\n" + out[-4000:]) from timeout
    assert proc.returncode == 0, out[-4000:]
    return out


def _losses(model_dir) -> list[float]:
    """The per-step train loss from TensorBoard (log_every 1)."""
    losses = {}
    for path in (model_dir / "tensorboard" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                if v.tag == "loss":
                    losses[event.step] = float(tf.make_ndarray(v.tensor))
    return [losses[k] for k in sorted(losses)]


def _summary(model_dir) -> dict:
    return json.loads((model_dir / "run_summary.json").read_text())


STEPS = 6
# Three replicas, a global batch of 3, and one of bucketed_dir's four length buckets (9, 12, 11 and 8 training
# records of 184, 224, 320 and 552 frames): on one device the buckets' batches are [9, 7, 5, 3]; under 3 replicas
# every batch must divide by 3, [9, 6, 3, 3] (gcd(B, 8) alone gave [9, 7, 5, 3], refused after the model dir was
# written, naming a batch never set). Bucket 0 gets batch 9 both ways (3 per replica), so the two runs draw the
# same seeded batches and their losses compare; it has validation records. Each bucket more is three more
# traces and compiles of the mirrored run: that under a strategy each bucket gets a distributed input of its own
# is checked in-process on two buckets (test_under_a_strategy_each_bucket_gets_a_distributed_input_...).
REPLICAS, BATCH, TRAINED = 3, 3, (0,)
N_BUCKETS, BUCKETS = len(TRAINED), "[" + "".join(str(b) for b in TRAINED) + "]"
TRAIN_GLOB, VAL_GLOB = f"train-b0{BUCKETS}-*.tfrecord", f"val-b0{BUCKETS}-*.tfrecord"


@pytest.fixture(scope="module")
def one_and_mirrored(bucketed_dir, tmp_path_factory):
    """The same 6 steps of LITE_MODEL (no dropout) on one length bucket, global batch 3, with validation: on
    one device (`one/`, its compiled steps kept in the persistent cache `xla-one/`), and mirrored on three CPU
    devices (`mirrored/`, its cache `xla-mirrored/`), from config `c.yaml`. Read-only for tests: copy a model
    dir or a cache before training on it."""
    tmp = tmp_path_factory.mktemp("one_and_mirrored")
    cfg = write_lite_config(
        tmp / "c.yaml",
        data={"batch_size": BATCH},
        # the full learning rate from the first step: a gradient that is not the global mean's moves the
        # mirrored losses off the one device's from step 2 (counts not summed over the replicas: up to 6.9e-5
        # relative; with TEST_CONFIG's 10 warm-up steps only step 6, by 2.1e-5); a correct run is within 4.1e-7
        optim={"warmup_steps": 1},
        # XLA, as by default: on one device the whole step is one compiled program, kept in the persistent
        # cache; under a strategy only each replica's pass is compiled (train/distribute.py)
        loop={"steps": STEPS, "log_every": 1, "checkpoint_every": STEPS, "val_every": STEPS, "jit_compile": True},
    )
    val = ["--val", str(bucketed_dir / VAL_GLOB)]
    for name, args in (
        ("one", ["--strategy", "one", *val]),
        ("mirrored", ["--strategy", "mirrored", "--cpu-devices", str(REPLICAS), *val]),
    ):
        _finish(_train(bucketed_dir, tmp / name, cfg, tmp / f"xla-{name}", *args, train_glob=TRAIN_GLOB))
    return tmp


def test_mirrored_on_three_cpu_devices_follows_the_single_device_losses(one_and_mirrored):
    """Each bucket's per-replica pass is compiled on each replica device; the losses are the one device's."""
    a, b = _losses(one_and_mirrored / "one"), _losses(one_and_mirrored / "mirrored")
    assert len(a) == len(b) == STEPS
    np.testing.assert_allclose(b, a, rtol=1e-5)  # measured: within 3e-7 (summation order)
    s, single = _summary(one_and_mirrored / "mirrored"), _summary(one_and_mirrored / "one")
    assert (s["strategy"], s["replicas"], s["workers"]) == ("mirrored", REPLICAS, 1)
    assert (s["global_batch_size"], s["per_replica_batch_size"]) == (BATCH, BATCH // REPLICAS)
    # the same buckets on both; each bucket's compiled per-replica pass is traced once on each replica
    # device, its outer function once
    used = single["buckets_used"]
    assert s["buckets_used"] == used == N_BUCKETS
    assert s["train_step_traces"] == REPLICAS * used and s["step_function_traces"] == used
    assert single["train_step_traces"] == used


def test_mirrored_on_3_devices_gives_every_bucket_a_batch_they_divide_and_validates(one_and_mirrored, bucketed_dir):
    """A replica count that does not divide 8 (5, 6 and 7 are checked on the pure batch sizing,
    tests/train/test_buckets.py): every bucket's batch divides by it, and validation runs under mirrored."""
    s = _summary(one_and_mirrored / "mirrored")
    batches = [b["batch_size"] for b in s["buckets"]]  # every bucket's, run or not
    assert len(batches) == 4 and [b % REPLICAS for b in batches] == [0] * 4
    val_records = sum(1 for f in bucketed_dir.glob(VAL_GLOB) for _ in tf.data.TFRecordDataset(str(f)))
    assert s["final_losses"]["val"]["examples"] == val_records > 0
    assert np.isfinite(s["final_losses"]["val"]["loss"])


def test_a_run_trained_under_mirrored_resumes_on_one_device(one_and_mirrored, bucketed_dir, tmp_path, caplog):
    """Weights, optimizer and step come back; the input position (not saved under a strategy) is reshuffled.
    In this process, through the CLI entry point (the resume is the loop's; a new process resuming is
    test_a_resumed_run_restores_every_step_untraced_and_loads_its_program_from_the_persistent_cache)."""
    from melshards.commands.train import run

    shutil.copytree(one_and_mirrored / "mirrored", tmp_path / "m")
    more = STEPS + 2
    args = ["--model-dir", str(tmp_path / "m"), "--config", str(one_and_mirrored / "c.yaml")]
    with caplog.at_level(logging.INFO, logger="melshards.train"):
        assert run([str(bucketed_dir / TRAIN_GLOB), *args, "--strategy", "one", "--steps", str(more)]) == 0
    out = caplog.text
    mirrored = tf.train.load_checkpoint(str(one_and_mirrored / "mirrored" / "checkpoints"))
    assert f"at step {STEPS}" in out and "holds no input position" in out and "reshuffled the input" in out
    s = _summary(tmp_path / "m")
    assert (s["strategy"], s["start_step"], s["final_step"]) == ("one", STEPS, more)
    resumed = tf.train.load_checkpoint(str(tmp_path / "m" / "checkpoints"))
    assert resumed.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == more
    assert any(k.startswith("iterator/") for k in resumed.get_variable_to_shape_map())  # one device saves it
    assert int(mirrored.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == STEPS
    # the optimizer resumed
    assert int(resumed.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == more


def test_a_resumed_run_restores_every_step_untraced_and_loads_its_program_from_the_persistent_cache(
    one_and_mirrored, bucketed_dir, tmp_path
):
    """On one device every bucket's train and eval step is traced once, compiled behind training and kept in
    the cache with its graph (train/programs.py); the run resumed from its checkpoint in a new process traces
    nothing: it restores every step's graph and finds every compiled program there, adds nothing, and prints
    no text-format parse error of the entries it reads (TensorFlow logs one per entry; train/tf_quiet.py drops
    it)."""
    shutil.copytree(one_and_mirrored / "one", tmp_path / "m")
    shutil.copytree(one_and_mirrored / "xla-one", tmp_path / "xla")
    args = ("--strategy", "one", "--steps", str(STEPS + 2), "--val", str(bucketed_dir / VAL_GLOB))
    cfg = one_and_mirrored / "c.yaml"
    out = _finish(_train(bucketed_dir, tmp_path / "m", cfg, tmp_path / "xla", *args, train_glob=TRAIN_GLOB))
    assert "XlaSerializedCacheEntry" not in out, out
    before = sorted(p.name for p in (one_and_mirrored / "xla-one").iterdir())
    first, resumed = _summary(one_and_mirrored / "one"), _summary(tmp_path / "m")
    assert (resumed["start_step"], resumed["final_step"]) == (STEPS, STEPS + 2)
    # the train and the eval step of each bucket: its compiled program and its saved graph
    assert sum(n.startswith("xla_compile_cache__") for n in before) == 2 * N_BUCKETS
    assert sum(n.startswith("melshards_program__") for n in before) == 2 * N_BUCKETS
    assert sorted(p.name for p in (tmp_path / "xla").iterdir()) == before  # nothing compiled again: every step found
    assert first["train_step_traces"] == N_BUCKETS and first["eval_step_traces"] == N_BUCKETS
    assert resumed["train_step_traces"] == 0 and resumed["eval_step_traces"] == 0  # restored, not traced
    assert (first["programs_restored"], first["programs_from_cache"]) == (0, 0)
    assert (resumed["programs_restored"], resumed["programs_from_cache"]) == (2 * N_BUCKETS, 2 * N_BUCKETS)
    # the model called to check its contract by the run that saved the first step, not again
    assert (first["contract"], resumed["contract"]) == ("checked", "checked by the run that saved its program")
    for summary in (first, resumed):
        assert [(p["kind"], p["bucket"]) for p in summary["programs"]] == [("train", 0), ("eval", 0)]
        assert summary["first_step_wait_s"] is not None and summary["programs"][0]["ready_s"] is not None
        assert summary["layers"] == {"device": "CPU", "conv": "im2col", "dropout_rng": "threefry"}


def _cluster(shards_dir, model_dir, cfg, cache, ports):
    workers = [f"127.0.0.1:{p}" for p in ports]
    procs = []
    for i in range(len(ports)):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(
            _train(shards_dir, model_dir, cfg, cache, "--strategy", "multiworker", env={"TF_CONFIG": tf_config})
        )
    return procs


def _digest(out: str) -> str:
    return re.findall(r"weights digest (\w+)", out)[-1]


def test_two_workers_preempted_by_sigterm_resume_to_the_target_with_equal_weights(shards_dir, tmp_path):
    """Worker 1 gets SIGTERM mid-run: every worker checkpoints and exits 0; a restart resumes and finishes.
    Checkpoints at the preemption and the target only (checkpoint_every is the target)."""
    steps = 12
    cfg = write_lite_config(
        tmp_path / "c.yaml",
        loop={"steps": steps, "log_every": 1, "checkpoint_every": steps, "val_every": steps},
    )
    model_dir, cache = tmp_path / "model", tmp_path / "xla"
    chief, other = _cluster(shards_dir, model_dir, cfg, cache, [_free_port(), _free_port()])
    lines, deadline = [], time.monotonic() + TIMEOUT
    for line in other.stdout:
        lines.append(line)
        if re.search(rf"step [3-9]/{steps}", line):
            other.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(lines)
    other_out = "".join(lines) + _finish(other)
    _finish(chief)
    stopped = _summary(model_dir)
    assert stopped["stopped_by"] == "SIGTERM" and 3 <= stopped["final_step"] < steps, other_out[-3000:]
    assert (model_dir / "checkpoints" / f"ckpt-{stopped['final_step']}.index").exists()

    chief, other = _cluster(shards_dir, model_dir, cfg, cache, [_free_port(), _free_port()])
    other_out, chief_out = _finish(other), _finish(chief)
    done = _summary(model_dir)
    assert f"at step {stopped['final_step']}" in chief_out
    assert done["start_step"] == stopped["final_step"] and done["final_step"] == steps
    assert (done["strategy"], done["workers"], done["replicas"]) == ("multiworker", 2, 2)
    assert done["train_step_traces"] == 1 and done["step_function_traces"] == 1  # one replica per worker
    assert (model_dir / "checkpoints" / f"ckpt-{steps}.index").exists()
    assert _digest(chief_out) == _digest(other_out)
    assert "one record in 2 of all 1 shard files" in chief_out  # one shard file, two workers
    assert not list(model_dir.glob("workertemp*"))
