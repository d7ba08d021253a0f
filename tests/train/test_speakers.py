"""Speakers and languages in the built-in model: it trains on shards of two speakers and two languages
(balanced by speaker), traces once per length bucket, and speaks as the speaker and in the language it is asked for."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import tensorflow as tf

from melshards.commands.synthesize import synthesize_command
from tests.train.conftest import LANGUAGES, SPEAKERS, TEST_CONFIG, made


@pytest.fixture(scope="module")
def two_speaker_model(two_speaker_bucketed_run):
    """16 steps of the built-in model on two speakers and two languages in two length buckets, speakers
    drawn equally often (tests/train/conftest.py `two_speaker_bucketed_run`, read by test_buckets.py too)."""
    return two_speaker_bucketed_run


@pytest.fixture(scope="module")
def synth(two_speaker_model):
    """The run's synthesizer, loaded (and its generate compiled) once for the tests that speak."""
    from melshards.train.synthesize import load_synthesizer

    return load_synthesizer(str(two_speaker_model[0]))


def test_the_builtin_model_trains_on_two_speakers_and_languages_with_one_trace_per_bucket(two_speaker_model):
    model_dir, summary = two_speaker_model
    assert summary["steps_run"] == 16 and made(summary) == [1, 1]
    assert np.isfinite(summary["final_losses"]["train"]["loss"])
    # the tables, sized by schema.json's speakers and languages, restore from the checkpoint (every variable
    # of the model must be matched by a saved value)
    from melshards.shards_schema import read_schema
    from melshards.train.checkpoints import restore_model
    from melshards.train.config import config_from_dict
    from melshards.train.model import build_text_to_mel

    model = build_text_to_mel(config_from_dict(TEST_CONFIG).model, read_schema(str(model_dir)), "float32")
    restore_model(model, tf.train.latest_checkpoint(str(model_dir / "checkpoints")))
    tables = model.conditioning
    assert tables.speaker.embeddings.shape == (len(SPEAKERS), 32)
    assert tables.language.embeddings.shape == (len(LANGUAGES), 16)
    assert tables.proj.kernel.shape == (32 + 16, TEST_CONFIG["model"]["d_model"])


def test_the_speaker_and_language_change_what_the_model_says(synth):
    from melshards.train.synthesize import normalise, padded_text_ids

    schema = synth.schema
    ids, n = padded_text_ids(normalise("Printing, in the only sense.", schema.languages[0]), schema)
    mels = {
        (s.name, lang.code): synth.speak(ids, n, s, lang)["mel"].numpy()
        for s in schema.speakers
        for lang in schema.languages
    }
    assert all(np.isfinite(m).all() for m in mels.values())
    assert not np.allclose(mels[SPEAKERS[0], LANGUAGES[0]], mels[SPEAKERS[1], LANGUAGES[0]])
    assert not np.allclose(mels[SPEAKERS[0], LANGUAGES[0]], mels[SPEAKERS[0], LANGUAGES[1]])
    # the serving signature takes names: the same generator
    served = synth.serve(
        tf.constant("printing, in the only sense."), tf.constant(SPEAKERS[1]), tf.constant(LANGUAGES[1])
    )
    np.testing.assert_allclose(served["mel"].numpy(), mels[SPEAKERS[1], LANGUAGES[1]], rtol=1e-5, atol=1e-5)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"unknown speaker: this model was trained on 2 "
        r"speaker\(s\): anna, bert",
    ):
        synth.serve(tf.constant("printing."), tf.constant("nobody"), tf.constant(LANGUAGES[0]))


def test_synthesize_speaks_as_the_speaker_asked_for(two_speaker_model, synth, tmp_path, monkeypatch):
    """The command passes --speaker and --language to the model's generate and writes its WAV (with the
    module's synthesizer: loading one from a model dir is what test_synthesize_cli.py's runs show)."""
    from melshards.train import synthesize as synthesize_module

    loaded, spoken = [], []

    def load_synthesizer(model_dir, checkpoint=None):
        loaded.append((model_dir, checkpoint))
        return synth

    def speak(ids, n, speaker, language, reference=None):
        spoken.append((speaker.name, language.code, reference))
        return type(synth).speak(synth, ids, n, speaker, language, reference)

    monkeypatch.setattr(synthesize_module, "load_synthesizer", load_synthesizer)
    monkeypatch.setattr(synth, "speak", speak)
    wav = tmp_path / "out.wav"
    synthesize_command.main(
        [
            "--model-dir",
            str(two_speaker_model[0]),
            "Printing.",
            "-o",
            str(wav),
            "--speaker",
            SPEAKERS[1],
            "--language",
            LANGUAGES[1],
            "--griffin-lim-iters",
            "1",
        ],
        standalone_mode=False,
    )
    y, _ = sf.read(wav)
    assert y.ndim == 1 and len(y) > 0
    assert [d for d, _ in loaded] == [str(two_speaker_model[0])]
    assert spoken == [(SPEAKERS[1], LANGUAGES[1], None)]


def test_speaker_and_language_embeddings_can_be_turned_off(two_speakers_dir):
    from melshards.shards_schema import read_schema
    from melshards.train.config import config_from_dict
    from melshards.train.model import build_text_to_mel
    from melshards.train.plugins import zero_batch

    schema = read_schema(str(two_speakers_dir))
    cfg = config_from_dict(dict(TEST_CONFIG, model=dict(TEST_CONFIG["model"], speaker_dim=0, language_dim=0)))
    off = build_text_to_mel(cfg.model, schema, "float32")
    assert off.conditioning is None and not any("conditioning" in v.path for v in off.variables)
    cfg = config_from_dict(dict(TEST_CONFIG, model=dict(TEST_CONFIG["model"], language_dim=0)))
    speaker_only = build_text_to_mel(cfg.model, schema, "float32")
    assert speaker_only.conditioning.language is None and speaker_only.conditioning.speaker is not None
    terms = speaker_only.loss_terms(zero_batch(schema, 2), tf.zeros([2], tf.int32), training=False)
    assert float(terms["examples"]) == 0.0  # padding records add nothing


def _without_training_records(schema, name: str):
    """`schema` as a run whose speaker `name` kept no training record (its clips filtered, rejected or
    in val): its row and id stay, its training records per bucket are 0."""
    import dataclasses

    gone = schema.speaker(name).id
    buckets = tuple(
        dataclasses.replace(
            b,
            groups=dict(
                b.groups,
                train=dict(
                    b.groups["train"],
                    speaker=[0 if i == gone else n for i, n in enumerate(b.groups["train"]["speaker"])],
                ),
            ),
        )
        for b in schema.buckets
    )
    return dataclasses.replace(schema, buckets=buckets)


def test_synthesize_refuses_a_speaker_without_training_records_in_one_line(two_speakers_dir, tmp_path):
    from click.testing import CliRunner

    from melshards.shards_schema import read_schema
    from melshards.shards_schema.config import ConfigError
    from melshards.train.synthesize import Synthesizer, pick_speaker
    from melshards.train.tf_quiet import tf

    gone, kept = SPEAKERS  # ids 0 and 1
    schema = _without_training_records(read_schema(str(two_speakers_dir)), gone)
    assert [s.name for s in schema.speakers] == [gone, kept] and schema.training_records()[0] == 0
    assert schema.training_records()[1] > 0 and schema.speaker(gone).clips > 0  # the row stays
    assert pick_speaker(schema, None).name == kept  # the only speaker it trained on
    said = (
        f"--speaker '{gone}' has no training records in the shards this model was trained on (its clips "
        "were all filtered, rejected or in the validation split), so the model never learnt its voice; pass one "
        f"of the 1 speaker(s) it trained on: '{kept}' (`melshards stats SHARDS --by speaker` lists the "
        "run's speakers with their clips per split)"
    )
    with pytest.raises(ConfigError) as e:
        pick_speaker(schema, gone)
    assert str(e.value) == said
    model = tmp_path / "model"
    model.mkdir()
    (model / "schema.json").write_text(schema.to_json())
    (model / "train_config.json").write_text("{}")
    args = ["Printing.", "--model-dir", str(model), "-o", str(tmp_path / "out.wav"), "--speaker", gone]
    result = CliRunner().invoke(synthesize_command, [*args, "--language", LANGUAGES[0]])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not (tmp_path / "out.wav").exists()

    class Echo:  # the serving signature's lookup, without a model
        variables = []

        def generate(self, text_ids, text_len, speaker_id, language_id):
            return {"mel": tf.zeros([1, 4, 2]), "mel_len": speaker_id}

    synth = Synthesizer(Echo(), schema)
    served = synth.serve(tf.constant("stop"), tf.constant(kept), tf.constant(LANGUAGES[0]))
    assert int(served["mel_len"][0]) == 1  # the speaker's id in schema.json's table
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"unknown speaker: this model was trained on 1 speaker\(s\): {kept}",
    ):
        synth.serve(tf.constant("stop"), tf.constant(gone), tf.constant(LANGUAGES[0]))
