"""Every bucket's step compiled up front (train/compile.py), and kept across runs (train/xla_cache.py).

That a resumed `melshards train` run loads every compiled step from the persistent cache is checked on the
one-device XLA runs tests/train/test_distribute.py makes anyway
(`test_a_resumed_run_loads_every_compiled_step_from_the_persistent_cache`).
"""

from __future__ import annotations

import os
import weakref

from melshards.train import xla_cache
from melshards.train.compile import align_function_names, compile_steps
from melshards.train.tf_quiet import tf  # noqa: I001


def test_the_cache_lives_in_the_users_cache_dir_unless_melshards_xla_cache_says(monkeypatch, tmp_path):
    monkeypatch.delenv("MELSHARDS_XLA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert xla_cache.default_cache_dir() == str(tmp_path / "melshards" / "xla")
    monkeypatch.setenv("MELSHARDS_XLA_CACHE", str(tmp_path / "mine"))
    assert xla_cache.default_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv("MELSHARDS_XLA_CACHE", "")
    assert xla_cache.default_cache_dir() is None


def test_enabling_the_cache_adds_its_flag_and_keeps_one_already_given(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=0")
    assert xla_cache.enable_persistent_cache(str(tmp_path / "c")) == str(tmp_path / "c")
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_auto_jit=0 --tf_xla_persistent_cache_directory={tmp_path / 'c'}"
    assert (tmp_path / "c").is_dir()
    assert xla_cache.enable_persistent_cache(str(tmp_path / "other")) == str(tmp_path / "c")
    assert not (tmp_path / "other").exists()
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    monkeypatch.setenv("MELSHARDS_XLA_CACHE", "")
    assert xla_cache.enable_persistent_cache() is None and os.environ["TF_XLA_FLAGS"] == ""


def test_functions_traced_after_aligning_get_the_same_names_whatever_ran_before():
    def traced_name(work_before: int) -> str:
        for _ in range(work_before):
            tf.constant(1.0) + 1.0  # eager ops take uids, as a checkpoint check does
        align_function_names()
        return tf.function(lambda x: x * 2).get_concrete_function(tf.TensorSpec([2])).name.decode()

    traced_name(0)  # a process's first trace sets things up once
    a, b = traced_name(0), traced_name(37)
    assert a.rsplit("_", 1)[0] == b.rsplit("_", 1)[0]
    assert int(a.rsplit("_", 1)[1]) % 100_000 == int(b.rsplit("_", 1)[1]) % 100_000 < 1000


def test_this_tensorflow_still_numbers_traced_functions_with_the_private_uid_counter():
    """Fails on a TensorFlow that moved or changed `ops.uid`: the persistent cache would miss on every
    resumed run (align_function_names logs it and goes on)."""
    from tensorflow.python.framework import ops

    assert callable(getattr(ops, "uid", None)), (
        f"TensorFlow {tf.__version__} has no tensorflow.python.framework.ops.uid"
    )
    assert align_function_names(), f"TensorFlow {tf.__version__}: ops.uid no longer counts up"
    start = ops.uid()
    name = tf.function(lambda x: x + 1).get_concrete_function(tf.TensorSpec([1])).name.decode()
    assert start < int(name.rsplit("_", 1)[1]) <= ops.uid(), f"{name} is not numbered by ops.uid ({start})"


def test_aligning_without_the_uid_counter_says_so_and_goes_on(monkeypatch, caplog):
    from tensorflow.python.framework import ops

    monkeypatch.delattr(ops, "uid")
    with caplog.at_level("WARNING", logger="melshards.train"):
        assert align_function_names() is False
    assert "persistent XLA cache will miss" in caplog.text


def test_trimming_the_xla_cache_removes_its_least_recently_used_programs_only(tmp_path):
    programs = [tmp_path / f"xla_compile_cache__{i}__{i}__XLA_CPU_JIT.pb" for i in range(5)]
    for age, f in enumerate(programs):  # programs[0] used last
        f.write_bytes(b"x" * 100)
        os.utime(f, (1_000_000 - age * 100, 1_000_000 - age * 100))
    os.utime(programs[4], (2_000_000, 1_000_000 - 400))  # written first, read last
    (tmp_path / "notes.txt").write_bytes(b"y" * 1000)
    assert xla_cache.prune(str(tmp_path), 250) == (3, 300)
    assert sorted(tmp_path.iterdir()) == sorted([programs[0], programs[4], tmp_path / "notes.txt"])
    assert xla_cache.prune(str(tmp_path), 250) == (0, 0)


def test_enabling_the_cache_trims_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    monkeypatch.setattr(xla_cache, "MAX_BYTES", 150)
    for i in range(3):
        (tmp_path / f"xla_compile_cache__{i}.pb").write_bytes(b"x" * 100)
    xla_cache.enable_persistent_cache(str(tmp_path))
    assert len(list(tmp_path.glob("*.pb"))) == 1


def test_compiling_up_front_traces_each_step_once_and_leaves_the_state_as_it_was():
    weight, counter = tf.Variable([1.0, 2.0]), tf.Variable(0, dtype=tf.int64)

    def make(n):
        @tf.function(input_signature=[{"x": tf.TensorSpec([n, 2])}], jit_compile=True)
        def step(batch):
            weight.assign_sub(0.5 * tf.reduce_mean(batch["x"] + 1.0, 0))
            counter.assign_add(1)
            return {"loss": tf.reduce_sum(weight)}

        return step

    train = {0: make(3), 2: make(5)}
    evals = {
        2: tf.function(
            lambda b: {"sum": tf.reduce_sum(b["x"]) + tf.reduce_sum(weight)},
            input_signature=[{"x": tf.TensorSpec([4, 2])}],
            jit_compile=True,
        )
    }
    report = compile_steps(
        train,
        {0: {"x": tf.TensorSpec([3, 2])}, 2: {"x": tf.TensorSpec([5, 2])}},
        evals,
        {2: {"x": tf.TensorSpec([4, 2])}},
        [weight, counter],
    )
    assert sorted(report) == [0, 2] and all(t["trace_s"] > 0 and t["compile_s"] > 0 for t in report.values())
    assert weight.numpy().tolist() == [1.0, 2.0] and int(counter.numpy()) == 0
    train[2]({"x": tf.ones([5, 2])})
    assert weight.numpy().tolist() == [0.0, 1.0]  # the real call still updates
    assert [s.experimental_get_tracing_count() for s in (*train.values(), *evals.values())] == [1, 1, 1]


def test_the_state_is_kept_in_host_memory_not_on_the_device_while_the_warm_up_steps_run():
    """No tensor copy of a state variable is alive during a warm-up call (on a GPU, device memory):
    the copies are numpy's, in host memory."""
    import gc

    weight, slot = tf.Variable(tf.ones([7, 13])), tf.Variable(tf.zeros([7, 13]))

    @tf.function(input_signature=[{"x": tf.TensorSpec([3, 13])}], jit_compile=True)
    def step(batch):
        slot.assign_add(tf.ones([7, 13]))
        weight.assign_sub(tf.reduce_mean(batch["x"]) + slot)
        return {"loss": tf.reduce_sum(weight)}

    def tensors_of_the_state_s_shape() -> int:
        gc.collect()
        return sum(
            1
            for o in gc.get_objects()
            # a weak proxy is skipped unasked: one whose object is gone raises on any other question
            if not isinstance(o, weakref.ProxyTypes)
            and isinstance(o, tf.Tensor)
            and not tf.is_symbolic_tensor(o)
            and tuple(o.shape) == (7, 13)
        )  # values, not the trace's graph tensors

    before, during = tensors_of_the_state_s_shape(), []

    def watched(batch):
        during.append(tensors_of_the_state_s_shape())
        return step(batch)

    watched.get_concrete_function = step.get_concrete_function
    compile_steps({0: watched}, {0: {"x": tf.TensorSpec([3, 13])}}, {}, {}, [weight, slot])
    assert during == [before]  # a device copy of each variable was 2 more
    assert (weight.numpy() == 1).all() and (slot.numpy() == 0).all()
