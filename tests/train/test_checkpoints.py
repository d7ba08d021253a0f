"""Checkpoints hold and restore every model variable; synthesis uses exactly those weights (the export's:
test_synthesize_cli.py).

The model dirs here hold random (not initial) weights written without training, in the layout
training writes, so nothing is compiled except the synthesis generator.
"""

from __future__ import annotations

import shutil

import click
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from melshards.commands.synthesize import synthesize_command
from melshards.shards_schema import read_schema
from melshards.train.checkpoints import (
    CHECKPOINT_DIR,
    LAYOUT_KEY,
    Checkpointer,
    RestoreError,
    restore_model,
    untracked_variables,
)
from melshards.train.config import config_from_dict
from melshards.train.input_pipeline import STATE_LAYOUT
from melshards.train.model import build_text_to_mel
from melshards.train.synthesize import load_synthesizer
from tests.train.conftest import SPOKEN_TEXT, TEST_CONFIG, saved_weights


def _variables_reachable_from(checkpoint_prefix: str, child: str) -> int:
    """Variables in the saved object graph reachable from the root's `child` node."""
    reader = tf.train.load_checkpoint(checkpoint_prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    start = next(c.node_id for c in graph.nodes[0].children if c.local_name == child)
    seen, todo, count = set(), [start], 0
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        count += any(a.name == "VARIABLE_VALUE" for a in graph.nodes[node].attributes)
        todo += [c.node_id for c in graph.nodes[node].children]
    return count


@pytest.fixture(scope="module")
def model(shards_dir):
    return build_text_to_mel(config_from_dict(TEST_CONFIG).model, read_schema(str(shards_dir)), "float32")


def test_every_model_variable_is_in_the_checkpoint_object_graph(model, tmp_path):
    ckpt = tf.train.Checkpoint(model=model)
    assert untracked_variables(ckpt, model) == []
    path = ckpt.write(str(tmp_path / "ckpt"))
    assert _variables_reachable_from(path, "model") == len(model.variables) > 60


def test_restore_fails_when_the_checkpoint_lacks_model_variables(model, tmp_path):
    path = tf.train.Checkpoint(other=tf.Variable(1.0)).write(str(tmp_path / "ckpt"))
    with pytest.raises(RestoreError, match="does not restore this model"):
        restore_model(model, path)


def _stream():
    return iter(tf.data.Dataset.range(100).shuffle(10, seed=1))


def _other_chain():
    """Another chain (two stages more): its saved state does not restore into _stream's."""
    return iter(tf.data.Dataset.range(100).shuffle(10, seed=1).map(lambda x: 2 * x).prefetch(2))


NOW = {"files": [], LAYOUT_KEY: STATE_LAYOUT}  # the data settings of a run of this melshards


def _checkpointer(model_dir, model, iterators, before_save=lambda: None, positions=(), data=NOW) -> Checkpointer:
    step = tf.Variable(0, dtype=tf.int64)
    return Checkpointer(
        str(model_dir), model, tf.Module(), step, iterators, data, 2, before_save=before_save, positions=positions
    )


def test_an_iterator_attached_after_the_restore_continues_where_the_saved_run_left_it(model, tmp_path):
    """A resumed run builds each bucket's input at its first call, after the checkpoint was restored: the
    iterator is restored as it is attached, and every saved position is in use by the next save."""
    saved = tf.Module()
    saved.bucket_00, saved.bucket_01 = _stream(), _stream()
    for _ in range(5):
        next(saved.bucket_01)
    _checkpointer(tmp_path, model, saved).save(1)
    expected = [int(next(saved.bucket_01)) for _ in range(3)]

    later = tf.Module()
    resumed = _checkpointer(tmp_path, model, later, before_save=lambda: setattr(later, "bucket_00", _stream()))
    assert resumed.restore() == []
    resumed.attach(later, "bucket_01", _stream())  # attached after the restore, as at the bucket's first call
    assert [int(next(later.bucket_01)) for _ in range(3)] == expected
    resumed.save(2)  # attaches bucket_00 first (before_save): every saved value was used

    later.bucket_02 = _stream()  # a bucket the checkpoint holds no position for: not an exact resume
    again = tf.Module()
    strict = _checkpointer(tmp_path, model, again)
    strict.restore()
    with pytest.raises(RestoreError, match="holds no input position for bucket_02"):
        strict.attach(again, "bucket_02", _stream())
    other_buckets = _checkpointer(tmp_path, model, tf.Module(), positions=["bucket_00", "bucket_02"])
    with pytest.raises(
        RestoreError, match="positions of bucket_00, bucket_01, this run's buckets are bucket_00, bucket_02"
    ):
        other_buckets.restore()  # refused before the run trains, not at its first save


def test_a_checkpoint_of_an_earlier_input_layout_resumes_with_a_fresh_input_and_another_chain_is_one_line(
    model, tmp_path
):
    """A checkpoint whose data settings record no input state layout (an earlier melshards, whose chain
    saved another state) restores the weights and starts the input afresh, naming the layout; an input
    position that still does not restore into the pipeline is a RestoreError, not tf.data's traceback."""
    saved = tf.Module()
    saved.bucket_00 = _other_chain()
    for _ in range(5):
        next(saved.bucket_00)
    before = {"files": []}  # what an earlier melshards recorded
    _checkpointer(tmp_path / "earlier", model, saved, data=before).save(1)
    _checkpointer(tmp_path / "now", model, saved, data=NOW).save(1)

    later = tf.Module()
    resumed = _checkpointer(tmp_path / "earlier", model, later)
    assert resumed.restore() == [
        f"input state layout 1 -> {STATE_LAYOUT} (the checkpoint's input position is of another melshards "
        "version's pipeline; resume with that version to keep it)"
    ]
    resumed.attach(later, "bucket_00", _stream())
    assert [int(next(later.bucket_00)) for _ in range(3)] == [int(x) for x in _stream()][:3], "not afresh"

    again = tf.Module()
    strict = _checkpointer(tmp_path / "now", model, again)
    assert strict.restore() == []
    with pytest.raises(RestoreError, match="holds an input position for bucket_00 that this input pipeline cannot"):
        strict.attach(again, "bucket_00", _stream())


@pytest.fixture(scope="module")
def speaking(speaking_model_dir):
    """A model dir whose stop token never fires (synthesis runs to max_mel_frames), and its saved weights."""
    return speaking_model_dir, saved_weights(speaking_model_dir)


def test_every_variable_of_a_restored_model_equals_the_saved_one(speaking):
    model_dir, saved = speaking
    values = [v.numpy() for v in load_synthesizer(str(model_dir)).model_variables]  # model.variables order
    assert len(values) == len(saved)
    assert [p for p, v in zip(saved, values) if not np.array_equal(saved[p], v)] == []


def _synthesize(model_dir, wav, *extra):
    synthesize_command.main(
        ["--model-dir", str(model_dir), SPOKEN_TEXT, "-o", str(wav), "--griffin-lim-iters", "2", *map(str, extra)],
        standalone_mode=False,
    )


STOP_BIAS = "model/stop_head/bias/.ATTRIBUTES/VARIABLE_VALUE"


def _with_stop_bias(model_dir, copy, bias: float) -> None:
    """A copy of model_dir whose newest checkpoint holds `bias` as the stop head's bias and every other
    tensor as saved: the checkpoint rewritten tensor by tensor (TF's SaveV2), no model built."""
    shutil.copytree(model_dir, copy)
    prefix = tf.train.latest_checkpoint(str(copy / CHECKPOINT_DIR))
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    tensors = [reader.get_tensor(n) for n in names]
    tensors[names.index(STOP_BIAS)] = np.full_like(tensors[names.index(STOP_BIAS)], bias)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)


def test_a_model_that_stops_before_speaking_is_reported_not_synthesized(speaking_model_dir, tmp_path):
    _with_stop_bias(speaking_model_dir, tmp_path / "m", 20.0)  # the stop token fires at the first step
    wav = tmp_path / "out.wav"
    with pytest.raises(click.ClickException) as raised:
        _synthesize(tmp_path / "m", wav)
    assert "stopped before speaking" in str(raised.value) and "4 mel frames" in str(raised.value)
    assert not wav.exists()


# -- damaged checkpoints --------------------------------------------------------------------------
def _two_checkpoints(speaking_model_dir, model_dir):
    """ckpt-10 and ckpt-20 (a copy), listed by the manager's `checkpoint` file, ckpt-20 the newest."""
    shutil.copytree(speaking_model_dir, model_dir)
    ckpts = model_dir / "checkpoints"
    for f in ckpts.glob("ckpt-10.*"):
        shutil.copy(f, ckpts / f.name.replace("ckpt-10", "ckpt-20"))
    tf.compat.v1.train.update_checkpoint_state(
        str(ckpts), str(ckpts / "ckpt-20"), [str(ckpts / "ckpt-10"), str(ckpts / "ckpt-20")]
    )
    return ckpts


def _damage(ckpts, name, how):
    data = next(ckpts.glob(f"{name}.data-*"))
    if how == "truncated":
        data.write_bytes(data.read_bytes()[:-100])
    elif how == "corrupted":  # one bit flipped in the middle of the data: a saved tensor's checksum fails
        flipped = bytearray(data.read_bytes())
        flipped[len(flipped) // 2] ^= 0x10
        data.write_bytes(bytes(flipped))
    elif how == "no data file":
        data.unlink()
    else:
        (ckpts / f"{name}.index").unlink()


def _files(d):
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns) for p in d.rglob("*"))


@pytest.mark.parametrize(
    "how, problem",
    [
        ("truncated", "its data file is truncated"),
        ("no index", "ckpt-20.index is missing"),
        ("corrupted", "TensorBundle at "),  # ... Checksum does not match
    ],
)
def test_resuming_from_a_damaged_checkpoint_names_it_and_the_intact_one_before(
    shards_dir, speaking_model_dir, tmp_path, test_config, capsys, how, problem
):
    from melshards.commands.train import run

    model_dir = tmp_path / "m"
    ckpts = _two_checkpoints(speaking_model_dir, model_dir)
    _damage(ckpts, "ckpt-20", how)
    before = _files(model_dir)
    code = run([str(shards_dir / "train-*.tfrecord"), "--model-dir", str(model_dir), "--config", str(test_config)])
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert f"checkpoint {ckpts / 'ckpt-20'} is damaged ({problem}" in line
    assert f"delete {ckpts}/ckpt-20.* to resume from ckpt-10, the previous checkpoint (intact)" in line
    assert "Traceback" not in err and _files(model_dir) == before  # nothing written


@pytest.mark.parametrize(
    "how, problem",
    [("corrupted", "Checksum does not match"), ("no data file", "ckpt-20.data-00000-of-00001; No such file")],
)
def test_a_corrupted_or_missing_data_file_is_refused_naming_the_intact_checkpoint_before(
    speaking_model_dir, tmp_path, how, problem
):
    from melshards.train.checkpoints import resume_checkpoint
    from melshards.train.errors import CheckpointError

    ckpts = _two_checkpoints(speaking_model_dir, tmp_path / "m")
    _damage(ckpts, "ckpt-20", how)
    with pytest.raises(CheckpointError) as refused:
        resume_checkpoint(str(ckpts))
    assert f"checkpoint {ckpts / 'ckpt-20'} is damaged (" in str(refused.value) and problem in str(refused.value)
    assert "to resume from ckpt-10, the previous checkpoint (intact)" in str(refused.value)


@pytest.mark.parametrize("how", ["corrupted", "truncated"])
def test_a_damaged_input_position_is_named_in_a_plain_line(tmp_path, how):
    """An iterator state (a variant tensor, read by the RestoreV2 op) with a flipped bit, or cut short: its
    problem is TensorFlow's own message without the eager op's wrapper (`{{function_node ...}}`,
    `[Op:RestoreV2]`), and a cut is named as a truncated data file, as it is for any other tensor."""
    from melshards.train.checkpoints import checkpoint_problem

    iterator = iter(tf.data.Dataset.range(1000).shuffle(100, seed=1))
    next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt-1"))
    assert checkpoint_problem(path) is None
    data = next(tmp_path.glob("ckpt-1.data-*"))
    damaged = bytearray(data.read_bytes())
    graph = damaged.find(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    assert graph > 0  # the iterator state is written before the object graph
    if how == "corrupted":
        damaged[graph // 2] ^= 0x10
    else:
        del damaged[graph // 2 :]
    data.write_bytes(bytes(damaged))
    problem = checkpoint_problem(path)
    assert problem and "function_node" not in problem and "[Op:" not in problem and not problem.startswith("{")
    assert problem.startswith("its data file is truncated (") == (how == "truncated")


def test_a_deleted_newest_checkpoint_resumes_from_the_one_before(speaking_model_dir, tmp_path):
    from melshards.train.checkpoints import resume_checkpoint

    ckpts = _two_checkpoints(speaking_model_dir, tmp_path / "m")
    for f in ckpts.glob("ckpt-20.*"):
        f.unlink()
    assert resume_checkpoint(str(ckpts)) == str(ckpts / "ckpt-10")
    assert tf.train.CheckpointManager(tf.train.Checkpoint(), str(ckpts), 3).latest_checkpoint == str(ckpts / "ckpt-10")


def test_a_relative_model_dir_finds_its_checkpoint_for_synthesis_and_resume(speaking_model_dir, tmp_path, monkeypatch):
    from melshards.train.checkpoints import resume_checkpoint
    from melshards.train.synthesize import checkpoint_to_restore

    shutil.copytree(speaking_model_dir, tmp_path / "run90")
    monkeypatch.chdir(tmp_path)
    assert checkpoint_to_restore("run90") == "run90/checkpoints/ckpt-10"
    assert resume_checkpoint("run90/checkpoints") == "run90/checkpoints/ckpt-10"
    assert resume_checkpoint("./run90/checkpoints/") == "./run90/checkpoints/ckpt-10"


def test_synthesis_from_a_truncated_checkpoint_names_it(speaking_model_dir, tmp_path):
    from melshards.train.errors import CheckpointError

    shutil.copytree(speaking_model_dir, tmp_path / "m")
    _damage(tmp_path / "m" / "checkpoints", "ckpt-10", "truncated")
    with pytest.raises(CheckpointError, match=r"ckpt-10 is damaged \(its data file is truncated"):
        load_synthesizer(str(tmp_path / "m"))


@pytest.mark.parametrize("how", ["truncated", "no index"])
def test_synthesize_with_a_damaged_checkpoint_is_exit_2_naming_it_and_creates_nothing(
    speaking_model_dir, tmp_path, how
):
    from click.testing import CliRunner

    from melshards.commands.synthesize import synthesize_command

    shutil.copytree(speaking_model_dir, tmp_path / "m")
    _damage(tmp_path / "m" / "checkpoints", "ckpt-10", how)
    out = tmp_path / "new" / "out.wav"
    result = CliRunner().invoke(synthesize_command, ["Printing.", "--model-dir", str(tmp_path / "m"), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "ckpt-10 is damaged" in result.output and "Traceback" not in result.output
    assert not out.parent.exists()
