"""The FastSpeech 2-style plug-in (examples/fastspeech2.py) on a run with durations, pitch and energy;
the features a model asks for (train/contract.py); pitch and energy normalisation (exact values)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf
import yaml

from melshards.commands.train import run
from melshards.shards_schema import read_schema
from tests.train.conftest import TEST_CONFIG, made

EXAMPLE = "examples.fastspeech2:build"
MODEL = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "predictor_layers": 1}


def _config(path, steps):
    cfg = {k: dict(v) for k, v in TEST_CONFIG.items()}
    cfg["model"] = dict(MODEL)
    cfg["data"]["batch_size"] = 4
    cfg["loop"].update(steps=steps, checkpoint_every=steps, log_every=2, val_every=steps)
    path.write_text(yaml.safe_dump(cfg))
    return path


# The run reads one of features_dir's four length buckets (not the largest), with validation records: one
# trace of the step and one of the eval step for it, none for the others. Every bucket more is two more traces
# (~4 CPU s of this model's); that each bucket read traces once is test_speakers.py's two-bucket run.
RUN_BUCKETS = (1,)


@pytest.fixture(scope="module")
def fs2_run(features_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fs2")
    code = run(
        [
            str(features_dir / "train-b01-*.tfrecord"),
            "--val",
            str(features_dir / "val-b01-*.tfrecord"),
            "--model-dir",
            str(tmp / "model"),
            "--config",
            str(_config(tmp / "c.yaml", 6)),
            "--model",
            EXAMPLE,
        ]
    )
    assert code == 0
    return tmp / "model", json.loads((tmp / "model" / "run_summary.json").read_text())


def test_fastspeech2_trains_on_durations_pitch_and_energy_with_one_trace_per_bucket(fs2_run, features_dir):
    _, summary = fs2_run
    losses = summary["final_losses"]["train"]
    assert set(losses) == {"loss", "mel_loss", "duration_loss", "pitch_loss", "energy_loss"}
    assert all(np.isfinite(v) for v in losses.values())
    schema = read_schema(str(features_dir))
    assert summary["steps_run"] == 6 and len(summary["buckets"]) == len(schema.buckets) > len(RUN_BUCKETS)
    # the bucket read traced (or restored) its step once, and its eval step once; the others none
    read = [int(b.index in RUN_BUCKETS) for b in schema.buckets]
    assert made(summary) == read
    assert summary["buckets_used"] == len(RUN_BUCKETS)
    assert made(summary, "eval") == read


def test_the_batch_holds_the_features_the_model_asks_for_and_no_python_ops(features_dir, tmp_path):
    """The Trainer's datasets, built without compiling its steps (a Trainer compiles them once the run
    starts; what is checked here is the input; tests/train/test_plugins.py checks a plug-in's datasets
    with every step compiled)."""
    from melshards.train.config import config_from_dict
    from melshards.train.input_pipeline import python_ops_in
    from melshards.train.inputs import resolve_inputs
    from melshards.train.trainer import Trainer

    cfg = config_from_dict({"model": dict(MODEL, factory=EXAMPLE), "data": {"batch_size": 2}})
    inputs = resolve_inputs([str(features_dir / "train-*.tfrecord")], [], None, cfg)
    built = Trainer(inputs, str(tmp_path / "m"), synthetic=False)
    assert built.names[-3:] == ("pitch", "energy", "durations")
    built.complete_input()  # each bucket's input is built at its first use
    assert built.datasets
    for ds in built.datasets.values():
        assert {"pitch", "energy", "durations"} <= set(ds.element_spec) and "audio" not in ds.element_spec
        assert python_ops_in(ds) == []


def test_a_model_asking_for_a_feature_the_shards_lack_stops_before_building(shards_dir, tmp_path, capsys):
    code = run(
        [
            str(shards_dir / "train-*.tfrecord"),
            "--model-dir",
            str(tmp_path / "m"),
            "--config",
            str(_config(tmp_path / "c.yaml", 2)),
            "--model",
            EXAMPLE,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "model 'examples.fastspeech2:build' needs the feature 'pitch'" in err and "features.pitch: true" in err
    assert not (tmp_path / "m" / "checkpoints").exists()


def test_regulate_gives_each_frame_the_phone_whose_durations_span_it():
    from examples.fastspeech2 import regulate

    idx = regulate(tf.constant([[2, 0, 3, 1], [1, 1, 0, 0]]), 8)
    # frames past the sum read index L = 4 (gather_frames gives them zeros)
    assert idx.numpy().tolist() == [[0, 0, 2, 2, 2, 3, 4, 4], [0, 1, 4, 4, 4, 4, 4, 4]]


def test_pitch_and_energy_are_normalised_globally_or_per_speaker(two_speakers_dir):
    import melshards

    schema = read_schema(str(two_speakers_dir))
    g = {"pitch": {"mean": 200.0, "std": 50.0, "frames": 10}, "energy": {"mean": 4.0, "std": 2.0, "frames": 12}}
    own = {"pitch": {"mean": 100.0, "std": 20.0, "frames": 4}, "energy": {"mean": 2.0, "std": 1.0, "frames": 4}}
    speakers = (dataclasses.replace(schema.speakers[0], stats=own), dataclasses.replace(schema.speakers[1], stats={}))
    norm = melshards.normalizer(dataclasses.replace(schema, feature_stats=g, speakers=speakers))
    pitch = tf.constant([[250.0, 0.0, 120.0], [250.0, 0.0, 120.0]])
    np.testing.assert_allclose(norm.pitch(pitch).numpy(), [[1.0, 0.0, -1.6]] * 2, rtol=1e-6)
    # speaker 0 by its own statistics, speaker 1 (none of its own) by the global ones; unvoiced stays 0
    np.testing.assert_allclose(
        norm.pitch(pitch, tf.constant([0, 1])).numpy(), [[7.5, 0.0, 1.0], [1.0, 0.0, -1.6]], rtol=1e-6
    )
    np.testing.assert_allclose(
        norm.invert_pitch(norm.pitch(pitch, tf.constant([0, 1])), tf.constant([0, 1])).numpy()[:, [0, 2]],
        [[250.0, 120.0]] * 2,
        rtol=1e-6,
    )
    np.testing.assert_allclose(norm.energy(tf.constant([[6.0], [6.0]]), tf.constant([0, 1])).numpy(), [[4.0], [1.0]])
    with pytest.raises(ValueError, match="features.pitch: true"):
        melshards.normalizer(schema).pitch(pitch)


def test_generate_speaks_with_predicted_durations_within_the_static_frames(features_dir):
    from examples.fastspeech2 import build

    schema = read_schema(str(features_dir))
    model = build(schema, MODEL)
    ids = tf.constant([[3, 4, 5, 6] + [0] * (schema.max_text_len - 4)])
    out = model.generate(ids, tf.constant([4]), tf.constant([0]), tf.constant([0]))
    assert out["mel"].shape == (1, schema.max_mel_frames, schema.n_mels)
    assert 0 <= int(out["mel_len"][0]) <= schema.max_mel_frames and np.isfinite(out["mel"].numpy()).all()
