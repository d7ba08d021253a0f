"""same_clip references in `melshards train` (schema.json `reference.source: same_clip`): a model asking for
reference_mel gets a seeded slice of each record's own mel, cut in the input pipeline (static shapes, one
trace per bucket, resumable), and its export takes a reference log-mel."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
import yaml

from melshards.commands.train import run
from melshards.shards_schema import read_schema
from tests.train.conftest import TEST_CONFIG, made

EXAMPLE = "examples.reference_tts:build"
FRAMES = 40


@pytest.fixture(scope="module")
def same_clip_dir(shards_dir, tmp_path_factory):
    """`shards_dir` as a same_clip run: such a run stores nothing more than a run without references, only
    schema.json's `reference` (preprocess/write/report.py `reference_record`: source and frames) differs."""
    out = tmp_path_factory.mktemp("same_clip") / "shards"
    shutil.copytree(shards_dir, out)
    schema = json.loads((out / "schema.json").read_text())
    schema["reference"] = {"source": "same_clip", "frames": FRAMES}
    (out / "schema.json").write_text(json.dumps(schema))
    return out


@pytest.fixture(scope="module")
def same_clip_model(same_clip_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("same_clip_model")
    cfg = {k: dict(v) for k, v in TEST_CONFIG.items()}
    cfg["model"] = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1}
    cfg["data"]["batch_size"] = 2
    cfg["loop"].update(steps=4, checkpoint_every=4, log_every=2, val_every=4, val_batches=2, jit_compile=False)
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    shards, model_dir = same_clip_dir, tmp / "model"
    args = [str(shards / "train-*.tfrecord"), "--val", str(shards / "val-*.tfrecord"), "--model-dir", str(model_dir)]
    assert run([*args, "--config", str(tmp / "c.yaml"), "--model", EXAMPLE]) == 0
    return model_dir, json.loads((model_dir / "run_summary.json").read_text())


def test_a_reference_model_trains_on_a_same_clip_run_with_one_trace_per_bucket(same_clip_model):
    _, summary = same_clip_model
    assert summary["steps_run"] == 4 and all(np.isfinite(v) for v in summary["final_losses"]["train"].values())
    assert summary["buckets_used"] == 1 and sum(made(summary)) == 1 and sum(made(summary, "eval")) == 1


def test_the_trainers_batches_hold_a_resumable_slice_of_each_records_own_mel(same_clip_dir, tmp_path):
    """The trainer's train input (`input_pipeline.train_dataset` with the run's SameClip): reference_mel
    [B, frames, n_mels] is frames of the record's own mel, and an iterator restored from a checkpoint (as
    the trainer's `iterator/bucket_NN`) yields the slices an uninterrupted one does."""
    from melshards.train.config import DataConfig
    from melshards.train.input_pipeline import train_dataset
    from melshards.train.references import same_clip

    schema = read_schema(str(same_clip_dir))
    names = ("mel", "mel_len", "reference_mel", "reference_len")
    cut = same_clip(schema, names)
    assert cut is not None and cut.frames == FRAMES
    files = sorted(str(p) for p in same_clip_dir.glob("train-*.tfrecord"))

    def ds():  # a new one each time, as a resumed run builds it (a dataset's iterators continue its shuffles)
        return train_dataset(files, schema.largest, DataConfig(batch_size=3, shuffle_buffer=8), names, 2, same_clip=cut)

    assert ds().element_spec["reference_mel"].shape == (2, 3, FRAMES, schema.n_mels)
    whole = [b for _, b in zip(range(4), ds())]
    for batch in whole[:2]:
        for mel, n, ref, k in zip(*(batch[x].numpy().reshape(-1, *batch[x].shape[2:]) for x in names)):
            assert 0 < k <= FRAMES and np.all(ref[k:] == schema.mel.pad_value)
            assert any(np.array_equal(ref[:k], mel[s : s + k]) for s in range(n - k + 1))
    it = iter(ds())
    next(it)
    path = tf.train.Checkpoint(it=it).write(str(tmp_path / "it"))
    resumed = iter(ds())
    tf.train.Checkpoint(it=resumed).read(path).assert_consumed()
    for expected in whole[1:]:
        np.testing.assert_array_equal(next(resumed)["reference_mel"].numpy(), expected["reference_mel"].numpy())


def test_a_same_clip_run_gives_references_only_to_models_asking_and_others_are_told_how(same_clip_dir, shards_dir):
    from melshards.train.plugins import PluginError, check_features, zero_batch

    schema = read_schema(str(same_clip_dir))
    names = check_features(EXAMPLE, schema)
    assert zero_batch(schema, 2, names)["reference_mel"].shape == (2, FRAMES, schema.n_mels)
    assert "reference_mel" not in zero_batch(schema, 2)
    with pytest.raises(PluginError, match="other_clip .*or same_clip"):
        check_features(EXAMPLE, read_schema(str(shards_dir)))


def test_the_export_of_a_reference_model_takes_a_reference_mel(same_clip_model, same_clip_dir, corpus_dir, tmp_path):
    """`melshards synthesize --export`'s SavedModel: `serving_with_reference` takes a reference log-mel
    computed by the preprocess mel (`reference_of_wav`); another reference gives another mel."""
    from melshards.preprocess.write.other_clip_references import reference_of_wav
    from melshards.train.synthesize import REFERENCE_SIGNATURE, load_synthesizer

    model_dir, _ = same_clip_model
    load_synthesizer(str(model_dir)).export(str(tmp_path / "export"))
    serve = tf.saved_model.load(str(tmp_path / "export")).signatures[REFERENCE_SIGNATURE]
    schema = read_schema(str(same_clip_dir))
    wavs = sorted((corpus_dir / "wavs").glob("*.wav"))
    outs = []
    for wav in (wavs[0], wavs[3]):
        mel, valid = reference_of_wav(str(wav), schema)
        outs.append(
            serve(
                text=tf.constant("hello there."),
                speaker=tf.constant(schema.speakers[0].name),
                language=tf.constant("en"),
                reference_mel=tf.constant(mel.astype(np.float32)),
                reference_len=tf.constant(valid, tf.int32),
            )
        )
    assert outs[0]["mel"].shape == (1, schema.max_mel_frames, schema.n_mels)
    assert not np.array_equal(outs[0]["mel"].numpy(), outs[1]["mel"].numpy())


def test_melshards_dataset_cuts_the_slices_the_trainer_cuts(same_clip_dir):
    """One implementation: `melshards.dataset(features=[..., "reference_mel"])` and the trainer's
    train_dataset give the same references for the same records and seed."""
    import melshards
    from melshards.train.config import DataConfig
    from melshards.train.input_pipeline import train_dataset
    from melshards.train.references import same_clip

    schema = read_schema(str(same_clip_dir))
    names = ("mel_len", "reference_mel", "reference_len")
    api = melshards.dataset(str(same_clip_dir / "train-*.tfrecord"), 3, features=names, shuffle=False, seed=4)
    files = sorted(str(p) for p in same_clip_dir.glob("train-*.tfrecord"))
    cfg = DataConfig(batch_size=3, seed=4)
    ours = train_dataset(files, schema.largest, cfg, names, None, shuffle=False, same_clip=same_clip(schema, names))
    assert set(api.element_spec) == set(names)
    for a, b in zip(api.take(3), ours.take(3)):
        np.testing.assert_array_equal(a["reference_mel"].numpy(), b["reference_mel"].numpy())
