"""Every bucket's step compiled behind training (train/compile.py), and kept across runs (train/xla_cache.py).

That a resumed `melshards train` run restores every step untraced and loads its compiled program from the
persistent cache is checked on the one-device XLA runs tests/train/test_distribute.py makes anyway
(`test_a_resumed_run_restores_every_step_untraced_and_loads_its_program_from_the_persistent_cache`).
"""

from __future__ import annotations

import os
import threading
import weakref

import pytest

from melshards.train import xla_cache
from melshards.train.compile import EVAL, TRAIN, Program, Warmup, flat_call_available, warmup_order
from melshards.train.programs import Scratch, from_trace, named_calls_available, restore
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


def _step(weight, counter, n):
    @tf.function(input_signature=[{"x": tf.TensorSpec([n, 2])}], jit_compile=True, autograph=False)
    def step(batch):
        weight.assign_sub(0.5 * tf.reduce_mean(batch["x"] + 1.0, 0))
        counter.assign_add(1)
        return {"loss": tf.reduce_sum(weight)}

    return step


@pytest.fixture
def scratch_handles(monkeypatch):
    """Weak references to every scratch variable handle the warm-ups make (`Scratch.handle`)."""
    made: list = []
    handle = Scratch.handle

    def recording(self, key, shape, dtype):
        h = handle(self, key, shape, dtype)
        made.append(weakref.ref(h))
        return h

    monkeypatch.setattr(Scratch, "handle", recording)
    return made


def test_a_scratch_gives_each_key_its_own_zeros_variable_freed_with_its_last_handle():
    scratch = Scratch()
    a = scratch.handle(0, [2], "float32")
    b = scratch.handle(1, tf.TensorShape([2]), tf.float32)  # the same shape and dtype: a variable of its own
    c = scratch.handle(("traced", 7), [3], "int64")
    assert scratch.handle(0, [2], "float32") is a
    tf.raw_ops.AssignAddVariableOp(resource=a, value=tf.ones([2]))

    def read(h, dtype):
        return tf.raw_ops.ReadVariableOp(resource=h, dtype=dtype).numpy().tolist()

    assert read(a, tf.float32) == [1.0, 1.0] and read(b, tf.float32) == [0.0, 0.0] and read(c, tf.int64) == [0, 0, 0]
    handles = [weakref.ref(h) for h in (a, b, c)]
    del a, b, c
    assert all(h() is not None for h in handles)  # the scratch holds them until it is freed
    scratch.free()
    assert all(h() is None for h in handles)


def test_the_warmup_compiles_each_step_once_on_a_scratch_copy_never_writing_the_trained_state(scratch_handles):
    weight, counter = tf.Variable([1.0, 2.0]), tf.Variable(0, dtype=tf.int64)
    train = {0: _step(weight, counter, 3), 2: _step(weight, counter, 5)}
    evaluate = tf.function(
        lambda b: {"sum": tf.reduce_sum(b["x"]) + tf.reduce_sum(weight)},
        input_signature=[{"x": tf.TensorSpec([4, 2])}],
        jit_compile=True,
        autograph=False,
    )
    programs = [
        Program(TRAIN, 2, train[2], {"x": tf.TensorSpec([5, 2])}),
        Program(TRAIN, 0, train[0], {"x": tf.TensorSpec([3, 2])}),
        Program(EVAL, 2, evaluate, {"x": tf.TensorSpec([4, 2])}),
    ]
    warmup = Warmup(programs, began=0.0, state=[weight, counter]).start()
    for p in programs:
        assert warmup.wait(p.kind, p.bucket) >= 0.0
    warmup.close()
    assert weight.numpy().tolist() == [1.0, 2.0] and int(counter.numpy()) == 0  # the scratch copy took the steps
    facts = warmup.facts()
    assert [(p["kind"], p["bucket"]) for p in facts["programs"]] == [(TRAIN, 2), (TRAIN, 0), (EVAL, 2)]
    ready = [p["ready_s"] for p in facts["programs"]]
    assert ready == sorted(ready) and all(p["trace_s"] > 0 and p["compile_s"] > 0 for p in facts["programs"])
    assert facts["programs_compiled"] == 3 and facts["programs_from_cache"] == 0  # no persistent cache here
    train[2]({"x": tf.ones([5, 2])})
    assert weight.numpy().tolist() == [0.0, 1.0] and int(counter.numpy()) == 1  # the real call still updates
    assert [f.experimental_get_tracing_count() for f in (*train.values(), evaluate)] == [1, 1, 1]
    assert scratch_handles and all(h() is None for h in scratch_handles)  # the scratch copy freed at the end


def test_warmup_order_is_the_order_the_schedule_first_calls_each_bucket_from_the_first_call():
    schedule = [3, 3, 1, 0, 3, 1, 2, 0].__getitem__
    assert warmup_order(schedule, 0, [0, 1, 2, 3]) == [3, 1, 0, 2]
    assert warmup_order(schedule, 3, [0, 1, 2, 3]) == [0, 3, 1, 2]  # a resumed run: from its call
    assert warmup_order(lambda call: 0, 0, [0, 5]) == [0, 5]  # never called: last


class _Gated:
    """A stand-in for a traced step whose compile waits for `gate` and logs to `events`."""

    def __init__(self, name, events, gate=None, error=None):
        self.name, self.events, self.gate, self.error = name, events, gate, error
        self.captured_inputs, self.variables = [], []

    def get_concrete_function(self):
        return self

    def _call_flat(self, inputs, captures):
        if self.gate is not None:
            self.gate.wait()
        if self.error is not None:
            raise self.error
        self.events.append(f"compiled {self.name}")
        return {}


def test_a_call_whose_program_is_late_waits_for_it_and_a_failed_compile_raises_at_the_wait():
    events, gate = [], threading.Event()
    programs = [
        Program(TRAIN, 0, _Gated("0", events), {}),
        Program(TRAIN, 1, _Gated("1", events, gate), {}),
        Program(EVAL, 0, _Gated("eval 0", events, error=ValueError("no XLA kernel for op Foo")), {}),
    ]
    warmup = Warmup(programs, began=0.0, state=[]).start()
    warmup.wait(TRAIN, 0)
    events.append("call 0")
    waiting = threading.Thread(target=lambda: (warmup.wait(TRAIN, 1), events.append("call 1")))
    waiting.start()
    assert not programs[1].ready.is_set()  # still compiling: the call must wait
    gate.set()
    waiting.join()
    assert events == ["compiled 0", "call 0", "compiled 1", "call 1"]
    with pytest.raises(ValueError, match="no XLA kernel"):
        warmup.wait(EVAL, 0)
    assert warmup.wait(EVAL, 7) == 0.0  # a program the warm-up does not hold: nothing to wait for
    warmup.close()


def test_a_stop_while_a_call_waits_for_its_program_ends_the_wait_without_recording_it():
    """A signal during the wait for a late program: the loop's call is not made (False), and the program's
    first wait is recorded only by the wait that got it."""
    gate, stop = threading.Event(), threading.Event()
    programs = [Program(TRAIN, 0, _Gated("0", [], gate), {})]
    warmup = Warmup(programs, began=0.0, stopped=stop.is_set, state=[]).start()
    stopping, backstop = threading.Timer(0.3, stop.set), threading.Timer(10, gate.set)  # a wait that ignores
    stopping.start()  # the stop ends when the program is ready, and fails below instead of hanging
    backstop.start()
    assert warmup.wait_unless_stopped(TRAIN, 0) is False
    assert programs[0].waited_s is None and programs[0].called_s is None
    stop.clear()
    gate.set()
    backstop.cancel()
    assert warmup.wait_unless_stopped(TRAIN, 0) is True
    assert programs[0].waited_s is not None and programs[0].called_s is not None
    warmup.close()


def test_this_tensorflow_still_takes_a_traced_functions_captured_inputs_as_arguments():
    """Fails on a TensorFlow that moved or changed `ConcreteFunction._call_flat`: the steps would compile
    at their first calls instead of behind training (the trainer logs it and goes on)."""
    assert flat_call_available(), (
        f"TensorFlow {tf.__version__}: no ConcreteFunction._call_flat(tensor_inputs, captured_inputs)"
    )


def test_this_tensorflow_still_calls_a_registered_function_by_name():
    """Fails on a TensorFlow whose eager context no longer registers a function definition and calls it by
    name (`add_function_def`, `has_function`, `call_function`): every run would trace every step again
    (the trainer logs it and goes on)."""
    assert named_calls_available(), f"TensorFlow {tf.__version__}: the eager context's call_function API changed"


def test_a_saved_step_is_restored_untraced_under_its_keys_name_and_updates_the_state_as_traced(tmp_path):
    weight, counter = tf.Variable([1.0, 2.0]), tf.Variable(0, dtype=tf.int64)
    step = _step(weight, counter, 3)
    traced = from_trace(step.get_concrete_function(), TRAIN, 0, "k1", [weight, counter])
    traced.save(str(tmp_path / "p.npz"))
    restored = restore(str(tmp_path / "p.npz"))
    assert restored.name == traced.name == "melshards_train_b00_k1"
    assert restored.matches([weight, counter]) and not restored.matches([tf.Variable([1.0, 2.0, 3.0]), counter])
    out = restored({"x": tf.ones([3, 2])}, restored.bind([weight, counter]))
    assert weight.numpy().tolist() == [0.0, 1.0] and int(counter.numpy()) == 1 and float(out["loss"]) == 1.0
    assert restore(str(tmp_path / "missing.npz")) is None


def _consts(fdef) -> list:
    """The Const nodes of a function definition, each as (its value and attributes, its control inputs)."""
    return [
        (tuple((k, v.SerializeToString(deterministic=True)) for k, v in sorted(n.attr.items())), tuple(n.input))
        for n in fdef.node_def
        if n.op == "Const"
    ]


def test_a_step_program_holds_each_distinct_constant_once_and_computes_what_the_trace_does():
    def make(weight):
        @tf.function(input_signature=[{"x": tf.TensorSpec([3])}], jit_compile=True, autograph=False)
        def step(batch):
            x = batch["x"]
            a = x * 2.0 + 2.0  # two Consts of one value
            with tf.control_dependencies([a]):
                c = tf.constant(2.0)  # the same value behind a control input: not the same node
            b = tf.reshape(x, [3, 1]) + tf.reshape(x * 3.0, [3, 1])  # two shape Consts of one value
            half, other = tf.constant(0.5), tf.constant(0.5)
            with tf.compat.v1.colocate_with(other.op):  # colocated with a Const that goes
                b = b * other + half
            weight.assign_add(tf.reduce_sum(a * c) * 0.5)
            return {"loss": tf.reduce_sum(b) * 2.0 + weight}

        return step

    weight, twin = tf.Variable(1.0), tf.Variable(1.0)
    traced, step = make(twin), make(weight)
    program = from_trace(step.get_concrete_function(), TRAIN, 0, "k2", [weight])
    main = next(f for f in program.library if f.signature.name == program.name)
    before, after = _consts(step.get_concrete_function().function_def), _consts(main)
    assert len(after) < len(before) and len(set(after)) == len(after) == len(set(before))
    assert any(inputs for _, inputs in after)  # the constant behind a control input kept its input
    names = {n.name for n in main.node_def}
    groups = [g.decode()[5:] for n in main.node_def if "_class" in n.attr for g in n.attr["_class"].list.s]
    assert groups and all(g in names for g in groups)  # colocated with nodes that are there
    x = tf.constant([1.0, -2.0, 0.5])
    want = traced({"x": x})
    got = program({"x": x}, program.bind([weight]))
    assert float(got["loss"]) == float(want["loss"]) and float(weight.numpy()) == float(twin.numpy())


def test_a_warmup_with_the_persistent_cache_saves_each_step_and_the_next_run_restores_it_without_tracing(
    tmp_path, caplog, scratch_handles
):
    def run(key, state_order=lambda weight, counter: [weight, counter]):
        weight, counter = tf.Variable([1.0, 2.0]), tf.Variable(0, dtype=tf.int64)
        step = _step(weight, counter, 4)
        warmup = Warmup([Program(TRAIN, 1, None, {"x": tf.TensorSpec([4, 2])}, key)], 0.0, str(tmp_path)).start()
        state = state_order(weight, counter)
        warmup.provide({(TRAIN, 1): step}, state)
        warmup.wait(TRAIN, 1)
        warmup.close()
        p = warmup.programs[TRAIN, 1]
        if p.program is not None:
            p.program({"x": tf.ones([4, 2])}, p.program.bind(state))
        else:
            step({"x": tf.ones([4, 2])})
        assert weight.numpy().tolist() == [0.0, 1.0]  # this run's variables updated
        assert scratch_handles and all(h() is None for h in scratch_handles)  # the scratch copy freed at the end
        return p, step.experimental_get_tracing_count()

    first, traces = run("k2")
    assert (first.restored, traces) == (False, 1) and (tmp_path / "melshards_program__k2.npz").exists()
    again, traces = run("k2")
    assert (again.restored, traces) == (True, 0)  # the same key: restored, never traced
    other, traces = run("k3")
    assert (other.restored, traces) == (False, 1)  # another key: traced
    with caplog.at_level("WARNING", logger="melshards.train"):
        unfit, traces = run("k2", lambda weight, counter: [counter, weight])  # not the variables it was saved with
    assert (unfit.restored, traces) == (False, 1) and "does not fit this model's variables" in caplog.text
