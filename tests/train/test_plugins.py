"""Model plug-ins (train/contract.py): the example trains, resumes exactly and synthesizes; bad
plug-ins stop before anything compiles, naming what is wrong."""

from __future__ import annotations

import json
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from melshards.commands.train import run
from tests.train.conftest import TEST_CONFIG, made, write_config

EXAMPLE = "examples.fastspeech_lite:build"
FS_MODEL = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1}


def _config(path, steps):
    """TEST_CONFIG with the example's model section (in place of the built-in's) and a short loop."""
    import yaml

    cfg = {k: dict(v) for k, v in TEST_CONFIG.items()}
    cfg["model"] = dict(FS_MODEL)
    cfg["loop"].update(steps=steps, checkpoint_every=4, log_every=2, val_every=4)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(shards, model_dir, cfg, *extra):
    return run(
        [
            str(shards / "train-*.tfrecord"),
            "--model-dir",
            str(model_dir),
            "--config",
            str(cfg),
            "--model",
            EXAMPLE,
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def example_run(two_speakers_dir, tmp_path_factory):
    """8 steps of the example on `two_speakers_dir` (two speakers, two languages), validating, through the CLI
    entry point: (model dir, run_summary.json, the run's Trainer). The one plug-in run the tests below read."""
    from melshards.train import loop

    built = []

    class Recorded(loop.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    tmp = tmp_path_factory.mktemp("fs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "Trainer", Recorded)
        val = str(two_speakers_dir / "val-*.tfrecord")
        assert _train(two_speakers_dir, tmp / "model", _config(tmp / "c.yaml", 8), "--val", val) == 0
    (trainer,) = built
    return tmp / "model", json.loads((tmp / "model" / "run_summary.json").read_text()), trainer


def test_example_plugin_trains_with_one_trace_checkpoints_and_tensorboard(example_run):
    model_dir, summary, _ = example_run
    assert summary["model_factory"] == EXAMPLE and summary["steps_run"] == 8
    assert summary["contract"] in ("checked", "checked by the run that saved its program")  # a shared cache
    assert sum(made(summary)) == 1 and sum(made(summary, "eval")) == 1
    assert summary["final_losses"]["train"]["loss"] < summary["first_loss"]
    assert set(summary["final_losses"]["train"]) == {"loss", "mel_loss", "length_loss"}
    assert set(summary["final_losses"]["val"]) == {"loss", "mel_loss", "length_loss", "examples"}
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.index")) == ["ckpt-4.index", "ckpt-8.index"]
    assert list((model_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert json.loads((model_dir / "train_config.json").read_text())["model"]["factory"] == EXAMPLE


def test_example_plugin_trains_on_two_speakers_and_two_languages_and_resumes_as_an_uninterrupted_run(
    example_run, two_speakers_dir, tmp_path
):
    """`example_run` is the uninterrupted run; the same 8 steps in two runs of 4 (the second resuming) end
    on the same weights, optimizer state and step."""
    whole, summary, _ = example_run
    assert np.isfinite(summary["final_losses"]["train"]["loss"])
    from examples.fastspeech_lite import build
    from melshards.shards_schema import read_schema
    from melshards.train.checkpoints import restore_model

    model = build(read_schema(str(two_speakers_dir)), FS_MODEL)  # a speaker and a language table of two rows
    restore_model(model, tf.train.latest_checkpoint(str(whole / "checkpoints")))  # every variable
    assert model.speaker_embed.embeddings.shape == model.language_embed.embeddings.shape == (2, FS_MODEL["d_model"])

    parts, val = tmp_path / "parts", ("--val", str(two_speakers_dir / "val-*.tfrecord"))
    assert _train(two_speakers_dir, parts, _config(tmp_path / "b.yaml", 4), *val) == 0
    assert _train(two_speakers_dir, parts, _config(tmp_path / "c.yaml", 8), *val) == 0
    assert json.loads((parts / "run_summary.json").read_text())["start_step"] == 4
    a, b = (tf.train.load_checkpoint(str(d / "checkpoints")) for d in (whole, parts))
    names = [n for n in a.get_variable_to_shape_map() if n.startswith(("model/", "optimizer/", "step/"))]
    assert any(n.startswith("optimizer/") for n in names)
    assert [n for n in names if not np.array_equal(a.get_tensor(n), b.get_tensor(n))] == [], (
        "the resumed run's weights differ from the uninterrupted run's"
    )


def test_example_plugin_dataset_graph_holds_no_python_ops(example_run):
    """The input `example_run`'s Trainer built for the example (its features, both speakers balanced as the
    config says): pure TF ops, and one trace of each step it compiled up front."""
    from melshards.train.input_pipeline import python_ops_in

    built = example_run[2]
    assert built.datasets and all(s.experimental_get_tracing_count() == 1 for s in built.train_steps.values())
    for ds in built.datasets.values():
        assert python_ops_in(ds) == []


def test_synthesis_uses_the_plugins_generate(example_run):
    from melshards.train.synthesize import load_synthesizer, padded_text_ids

    synth = load_synthesizer(str(example_run[0]))
    ids, n = padded_text_ids("printing, in the only sense.", synth.schema)
    out = synth.speak(ids, n, synth.schema.speakers[0], synth.schema.languages[0])
    assert out["mel"].shape == (1, synth.schema.max_mel_frames, synth.schema.n_mels)
    assert 1 <= int(out["mel_len"][0]) <= synth.schema.max_mel_frames
    assert np.isfinite(out["mel"].numpy()).all()


BAD_PLUGINS = textwrap.dedent('''
    import keras
    import tensorflow as tf

    EAGER_CALLS = []  # one entry per eager loss_terms call (the contract check's)
    WIDTH, FULL = 1, True  # what `drifting` builds: module state, so outside its steps' program key

    class NoFrames(keras.Model):
        """Valid but for its loss terms: no mel_frames. Without generate. Conditions on the speaker
        (every batch carries speaker_id and language_id). Built by its first call."""
        def __init__(self, schema, full=False, width=1):
            super().__init__()
            self.full = full
            self.dense = keras.layers.Dense(width)
            self.speaker = keras.layers.Embedding(len(schema.speakers), 1)
            self.language = keras.layers.Embedding(len(schema.languages), 1)

        def call(self, mel, speaker_id, language_id):
            return self.dense(mel) + (self.speaker(speaker_id) + self.language(language_id))[:, None, :]

        def loss_terms(self, batch, seed, training):
            if tf.executing_eagerly():
                EAGER_CALLS.append(type(self).__name__)
            err = tf.reduce_sum(tf.abs(self(batch["mel"], batch["speaker_id"], batch["language_id"])))
            terms = {"err": err, "examples": tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32))}
            if self.full:
                terms["mel_frames"] = tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32)
            return terms

        def loss_counts(self, batch):
            return {"examples": tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32))}

        def losses_from_terms(self, terms):
            return {"loss": terms["err"] / tf.maximum(terms["examples"], 1.0)}

    class StepNamed(NoFrames):
        """Valid but for a loss named like the train step's gradient norm."""
        def losses_from_terms(self, terms):
            return dict(super().losses_from_terms(terms), grad_norm=terms["err"])

    class OldGenerate(NoFrames):
        """A generate without the speaker and language ids (train/contract.py before they existed)."""
        def generate(self, text_ids, text_len):
            return {}

    def no_frames(schema, options):
        return NoFrames(schema)

    def no_generate(schema, options):
        return NoFrames(schema, full=True)

    def old_generate(schema, options):
        return OldGenerate(schema, full=True)

    def step_named(schema, options):
        return StepNamed(schema, full=True)

    def drifting(schema, options):
        """NoFrames of WIDTH outputs with mel_frames if FULL, built here (not by its first call)."""
        model = NoFrames(schema, full=FULL, width=WIDTH)
        model(tf.zeros([1, 1, schema.n_mels]), tf.zeros([1], tf.int32), tf.zeros([1], tf.int32))
        return model

    def not_a_model(schema, options):
        return {"weights": 1}

    def one_argument(schema):
        return NoFrames(schema, full=True)
''')


@pytest.fixture
def bad_plugins(tmp_path, monkeypatch):
    (tmp_path / "bad_plugins.py").write_text(BAD_PLUGINS)
    (tmp_path / "broken_plugin.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            "broken_plugin:build",
            "module 'broken_plugin' does not import (ModuleNotFoundError: No module named 'no_such_module_anywhere')",
        ),
        ("bad_plugins:buld", "module 'bad_plugins' has no 'buld'; its callables are: NoFrames, OldGenerate, StepNamed"),
        ("bad_plugins", "is not of the form package.module:factory"),
        ("bad_plugins:not_a_model", "returned a builtins.dict, not a keras.Model"),
        ("bad_plugins:no_frames", "NoFrames.loss_terms misses the key(s) mel_frames"),
        ("bad_plugins:step_named", "StepNamed.losses_from_terms returns grad_norm, the name(s) of what the train step"),
        (
            "bad_plugins:one_argument",
            "model factory 'bad_plugins:one_argument' takes (schema), so it cannot be called as "
            "factory(schema, options) (too many positional arguments); give it the parameters of that call, "
            "e.g. def one_argument(schema, options): ...",
        ),
    ],
)
def test_a_bad_plugin_is_a_usage_error_before_anything_compiles(factory, message, four_records, bad_plugins, capsys):
    """One line naming what is wrong, and the model dir left unmarked: a run that never started records no
    settings (which would refuse the next run's model as "trained with other settings")."""
    cfg = write_config(bad_plugins / "c.yaml", model={})
    model_dir = bad_plugins / "m"
    code = run(
        [
            str(four_records / "train-*.tfrecord"),
            "--model-dir",
            str(model_dir),
            "--config",
            str(cfg),
            "--model",
            factory,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not model_dir.exists() or list(model_dir.iterdir()) == []


def test_a_train_steps_outputs_give_its_models_loss_names_as_the_contract_check_does():
    from melshards.train.plugins import step_loss_names

    outputs = ["examples", "grad_norm", "learning_rate", "length_loss", "loss", "losses", "mel_frames", "a_loss"]
    assert step_loss_names(outputs) == ("loss", "a_loss", "length_loss")


def _trainer(factory: str, shards, model_dir):
    """A Trainer of `factory` (no options) on `shards`, its steps compiling behind from now on."""
    import time

    from melshards.train.config import config_from_dict
    from melshards.train.inputs import resolve_inputs
    from melshards.train.trainer import Trainer

    cfg = config_from_dict(dict(TEST_CONFIG, model={"factory": factory}))
    inputs = resolve_inputs([str(shards / "train-*.tfrecord")], [], None, cfg)
    return Trainer(inputs, str(model_dir), False, began=time.perf_counter())


def _saved(factory: str, shards, model_dir):
    """`_trainer`, its first train step traced, saved and compiled (the warm-up closed then): the run whose
    program the next one restores. Returns the trainer."""
    from melshards.train.compile import TRAIN

    trainer = _trainer(factory, shards, model_dir)
    try:
        trainer.warmup.wait(TRAIN, next(iter(trainer.warmup.programs))[1])
    finally:
        trainer.close_warmup()
    return trainer


@pytest.fixture
def own_cache(tmp_path, monkeypatch, bad_plugins):
    """The warm-ups save and restore their programs in a cache of this test's own, `bad_plugins` importable
    with its module state (WIDTH, FULL, EAGER_CALLS) reset. Returns the module."""
    import bad_plugins as module

    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path / 'xla'}")
    (tmp_path / "xla").mkdir()
    monkeypatch.setattr(module, "WIDTH", 1)
    monkeypatch.setattr(module, "FULL", True)
    monkeypatch.setattr(module, "EAGER_CALLS", [])
    return module


def test_a_trainer_whose_first_step_is_restored_takes_its_loss_names_from_it_without_calling_the_model(
    own_cache, four_records, tmp_path
):
    """The run that saved the program called the model (the contract check); one restoring it does not, and
    lists the same losses."""
    from melshards.train.compile import TRAIN

    first = _saved("bad_plugins:drifting", four_records, tmp_path / "a")
    again = _trainer("bad_plugins:drifting", four_records, tmp_path / "b")
    again.close_warmup()
    assert own_cache.EAGER_CALLS == ["NoFrames"]  # the first run's check; the second called nothing
    assert (first.contract, again.contract) == ("checked", "checked by the run that saved its program")
    assert again.loss_names == first.loss_names == ("loss",)
    assert again.warmup.programs[TRAIN, 0].restored


def test_a_step_saved_under_other_xla_flags_is_traced_and_compiled_again(
    own_cache, four_records, tmp_path, monkeypatch
):
    """XLA_FLAGS is in the program key: XLA's own cache would otherwise hand back the program compiled
    under the old flags."""
    from melshards.train.compile import TRAIN

    _saved("bad_plugins:drifting", four_records, tmp_path / "a")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    again = _trainer("bad_plugins:drifting", four_records, tmp_path / "b")
    again.close_warmup()
    assert not again.warmup.programs[TRAIN, 0].restored
    assert again.contract == "checked"


def test_a_broken_plugin_is_refused_cold_and_when_a_restored_program_does_not_fit_it(own_cache, four_records, tmp_path):
    """A model without mel_frames: refused before anything is traced on a cold run, and on a run whose first
    program the cache holds under the same key but for other variables (the warm-up would trace it)."""
    from melshards.train.plugins import PluginError

    own_cache.FULL = False
    with pytest.raises(PluginError, match="misses the key"):
        _trainer("bad_plugins:drifting", four_records, tmp_path / "cold")
    own_cache.FULL = True
    _saved("bad_plugins:drifting", four_records, tmp_path / "a")
    own_cache.FULL, own_cache.WIDTH = False, 2
    with pytest.raises(PluginError, match="misses the key"):
        _trainer("bad_plugins:drifting", four_records, tmp_path / "b")


def test_a_restored_program_that_does_not_fit_the_model_is_traced_after_the_model_is_checked_and_compiles(
    own_cache, four_records, tmp_path
):
    """The same key, other variables: the model is called (its optimizer made after that call) and the warm-up
    traces the step and compiles it on a scratch copy of this model's state (optimizer slots included)."""
    from melshards.train.compile import TRAIN

    _saved("bad_plugins:drifting", four_records, tmp_path / "a")
    own_cache.WIDTH = 2
    other = _saved("bad_plugins:drifting", four_records, tmp_path / "b")
    assert own_cache.EAGER_CALLS == ["NoFrames", "NoFrames"] and other.contract == "checked"
    program = other.warmup.programs[TRAIN, 0]
    assert not program.restored and program.error is None and program.ready_s is not None


def test_a_model_its_factory_leaves_unbuilt_is_called_even_when_its_program_is_restored(
    own_cache, four_records, tmp_path
):
    first = _saved("bad_plugins:no_generate", four_records, tmp_path / "a")
    again = _trainer("bad_plugins:no_generate", four_records, tmp_path / "b")
    again.close_warmup()
    assert own_cache.EAGER_CALLS == ["NoFrames", "NoFrames"] and again.contract == "checked"
    assert again.loss_names == first.loss_names and again.model.trainable_variables


@pytest.mark.parametrize(
    "factory, message",
    [
        ("bad_plugins:no_generate", "has no generate(text_ids, text_len, speaker_id, language_id) method"),
        (
            "bad_plugins:old_generate",
            "OldGenerate.generate(text_ids, text_len) does not take (text_ids, text_len, speaker_id, language_id)",
        ),
    ],
)
def test_synthesize_refuses_a_model_without_generate(factory, message, speaking_model_dir, bad_plugins):
    """A model dir of a plug-in without a usable generate: `speaking_model_dir` with the factory in its
    train_config.json (synthesize refuses it before restoring, so the checkpoint is never read); the model
    passes every check training makes (`build_model`), so such a plug-in trains."""
    import json

    from melshards.commands.synthesize import synthesize_command
    from melshards.shards_schema import read_schema
    from melshards.train.plugins import build_model

    model_dir = shutil.copytree(speaking_model_dir, bad_plugins / "m")
    config = json.loads((model_dir / "train_config.json").read_text())
    config["model"] = {"factory": factory}
    (model_dir / "train_config.json").write_text(json.dumps(config))
    build_model(factory, read_schema(str(model_dir)), {})  # what training checks before it builds its steps
    with pytest.raises(Exception) as refused:
        synthesize_command.main(
            ["--model-dir", str(model_dir), "Printing.", "-o", str(bad_plugins / "o.wav")], standalone_mode=False
        )
    assert message in str(refused.value)
    assert not (bad_plugins / "o.wav").exists()


def test_the_builtin_model_keeps_strict_config_validation(four_records, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", model={"d_modle": 32})
    assert run([str(four_records / "train-*.tfrecord"), "--model-dir", str(tmp_path / "m"), "--config", str(cfg)]) == 2
    assert "unknown key(s) d_modle" in capsys.readouterr().err


def test_the_example_plugin_takes_each_length_buckets_own_shapes(bucketed_dir):
    """A batch's text and mel widths are its bucket's (train/contract.py), narrower than the schema's
    largest in every bucket but the last: the example's masks and frames follow the batch, and its loss
    terms are finite in each (eager, nothing traced)."""
    from examples.fastspeech_lite import build
    from melshards.shards_schema import read_schema
    from melshards.train.step import step_specs

    schema = read_schema(str(bucketed_dir))
    widths = {(b.max_text_len, b.max_mel_frames) for b in schema.buckets}
    assert len(widths) == len(schema.buckets) > 1  # buckets of their own shapes
    model = build(schema, FS_MODEL)
    for bucket in schema.buckets:
        batch = {k: tf.zeros(s.shape, s.dtype) for k, s in step_specs(bucket, 2).items()}
        batch.update(text_len=tf.constant([1, 3]), mel_len=tf.constant([2, 5]))
        terms = model.loss_terms(batch, tf.constant([1, 2]), training=True)
        counts = model.loss_counts(batch)
        assert terms["mel_count"].numpy() == counts["mel_count"].numpy() == (2 + 5) * schema.n_mels
        assert all(np.isfinite(v.numpy()) for v in terms.values())


def test_the_example_plugins_dropout_draws_its_masks_from_the_steps_seed(shards_dir):
    """`dropout` (examples/fastspeech_lite.py): while training, the same seed gives the same loss terms and
    another seed others, so a resumed run draws the masks an uninterrupted one drew (test_resume.py runs it);
    no dropout while not training, none at the default rate 0, and a rate outside [0, 1) is a config
    error (eager, nothing traced)."""
    from examples.fastspeech_lite import build, validate
    from melshards.shards_schema import read_schema
    from melshards.shards_schema.config import ConfigError
    from melshards.train import device
    from melshards.train.step import step_specs

    schema = read_schema(str(shards_dir))
    with device.building_for(device.choices_for("CPU", jit_compile=False)):  # as the trainer builds it, eager
        dropping, plain = build(schema, dict(FS_MODEL, dropout=0.5)), build(schema, FS_MODEL)
    plain.set_weights(dropping.get_weights())
    batch = {k: tf.zeros(s.shape, s.dtype) for k, s in step_specs(schema.buckets[0], 2).items()}
    batch.update(text_len=tf.constant([3, 5]), mel_len=tf.constant([4, 9]))

    def mel_abs(model, seed, training=True):
        return model.loss_terms(batch, tf.constant(seed), training)["mel_abs"].numpy()

    assert mel_abs(dropping, [1, 2]) == mel_abs(dropping, [1, 2]) != mel_abs(dropping, [1, 3])
    assert mel_abs(dropping, [1, 2], training=False) == mel_abs(plain, [1, 3])  # the same weights, no mask
    with pytest.raises(ConfigError, match="model.dropout is 1.0"):
        validate(schema, dict(FS_MODEL, dropout=1.0))
