"""`melshards synthesize` refuses what it cannot do with exit 2 and a reason, before the slow work; and what
its runs write: the WAV and the export (the session's `spoken` fixture, tests/train/conftest.py, read only
here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner, Result

from melshards.commands.synthesize import synthesize_command
from melshards.shards_schema.text import TextRejected, check_text
from melshards.train import synthesize as synthesize_module
from tests.train.conftest import saved_weights

FIX = "pass the --model-dir of a `melshards train` run"


@pytest.fixture(scope="module")
def serve(spoken):
    """The serving signature of `spoken`'s export (random weights, a stop head that never stops): loaded
    once for the tests of what it refuses and what it speaks."""
    import tensorflow as tf

    return tf.saved_model.load(str(spoken["export"])).signatures["serving_default"]


def synthesize(*args) -> Result:
    result = CliRunner().invoke(synthesize_command, [str(a) for a in args])
    # an error must be a message and an exit code, never a traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.mark.parametrize("text", ["--- !!! ???", "   "])
def test_text_preprocess_would_reject_is_refused_with_the_same_reason(speaking_model_dir, tmp_path, text):
    with pytest.raises(TextRejected) as rejected:  # the check preprocess makes of every transcript
        check_text(text, "en", "english")
    wav = tmp_path / "out.wav"
    result = synthesize("--model-dir", speaking_model_dir, "-o", wav, "--", text)  # "--": the text starts with "-"
    assert result.exit_code == 2, result.output
    assert f"({rejected.value.reason})" in result.output and "melshards preprocess" in result.output
    assert not wav.exists()


def test_output_into_a_missing_directory_creates_it(spoken):
    """`spoken` synthesized to -o new/deeper/out.wav, where new/ did not exist."""
    y, _ = sf.read(spoken["first"])
    assert y.ndim == 1 and len(y) > 0 and spoken["wav"].parent.name == "deeper"


def test_output_under_a_file_is_refused_before_the_model_is_loaded(tmp_path, monkeypatch):
    looks_trained = tmp_path / "model"
    looks_trained.mkdir()
    for name in ("schema.json", "train_config.json"):
        (looks_trained / name).write_text("{}")

    def load_synthesizer(model_dir):
        raise AssertionError("the model was loaded before -o was checked")

    monkeypatch.setattr(synthesize_module, "load_synthesizer", load_synthesizer)
    (tmp_path / "taken").write_text("a file, not a directory")
    result = synthesize("Printing.", "--model-dir", looks_trained, "-o", tmp_path / "taken" / "out.wav")
    assert result.exit_code == 2, result.output
    assert f"-o {tmp_path / 'taken' / 'out.wav'}: cannot create its directory" in result.output


def test_a_missing_model_dir_says_what_to_pass_and_creates_nothing(tmp_path):
    out = tmp_path / "new" / "out.wav"
    result = synthesize("Printing.", "--model-dir", tmp_path / "nope", "-o", out)
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'nope'} is not a melshards train model dir: it does not exist" in result.output
    assert FIX in result.output
    assert "--schema" not in result.output and "preprocess" not in result.output
    assert not out.parent.exists()


def test_a_preprocessing_output_is_not_taken_for_a_model_dir(shards_dir, tmp_path):
    result = synthesize("Printing.", "--model-dir", shards_dir, "-o", tmp_path / "out.wav")
    assert result.exit_code == 2, result.output
    assert "is not a melshards train model dir: it holds no train_config.json" in result.output
    assert FIX in result.output


@pytest.mark.parametrize("iters", ["0", "-3"])
def test_no_griffin_lim_iterations_is_refused_before_the_model_is_loaded(tmp_path, monkeypatch, iters):
    """Fewer than one iteration would write Griffin-Lim's random initial phases as the WAV (librosa accepts 0
    and -3 alike); refused before the slow work, with nothing created."""
    looks_trained = tmp_path / "model"
    looks_trained.mkdir()
    for name in ("schema.json", "train_config.json"):
        (looks_trained / name).write_text("{}")

    def load_synthesizer(*args, **kwargs):
        raise AssertionError("the model was loaded before --griffin-lim-iters was checked")

    monkeypatch.setattr(synthesize_module, "load_synthesizer", load_synthesizer)
    wav = tmp_path / "new" / "out.wav"
    result = synthesize("Printing.", "--model-dir", looks_trained, "-o", wav, "--griffin-lim-iters", iters)
    assert result.exit_code == 2, result.output
    assert "--griffin-lim-iters" in result.output
    assert not wav.parent.exists()


def _refuse_loading(monkeypatch):
    def load_synthesizer(*args, **kwargs):
        raise AssertionError("the model was loaded before the call was checked")

    monkeypatch.setattr(synthesize_module, "load_synthesizer", load_synthesizer)


def _looks_trained(shards_dir, path: Path, checkpoint: bool = True) -> Path:
    """A model dir with the run's schema.json, a train_config.json and (optionally) a checkpoint index."""
    path.mkdir()
    shutil.copy(shards_dir / "schema.json", path / "schema.json")
    (path / "train_config.json").write_text("{}")
    if checkpoint:
        (path / "checkpoints").mkdir()
        (path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
        (path / "checkpoints" / "ckpt-10.index").write_bytes(b"")
    return path


def test_output_that_is_a_directory_is_refused_before_the_model_is_loaded(shards_dir, tmp_path, monkeypatch):
    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model")
    (tmp_path / "wavs").mkdir()
    result = synthesize("Printing.", "--model-dir", model, "-o", tmp_path / "wavs")
    assert result.exit_code == 2, result.output
    assert f"-o {tmp_path / 'wavs'} names a directory" in result.output
    assert list((tmp_path / "wavs").iterdir()) == []


def test_a_model_dir_without_a_checkpoint_is_refused_and_creates_nothing(shards_dir, tmp_path, monkeypatch):
    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model", checkpoint=False)
    out = tmp_path / "new" / "out.wav"
    result = synthesize("Printing.", "--model-dir", model, "-o", out)
    assert result.exit_code == 2, result.output
    assert f"{model / 'checkpoints'} holds no checkpoint; train the model first" in result.output
    assert not out.parent.exists() and not (model / "checkpoints").exists()


def test_a_text_longer_than_the_model_reads_is_refused_before_loading(shards_dir, tmp_path, monkeypatch):
    from melshards.shards_schema import read_schema

    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model")
    limit = read_schema(str(shards_dir)).max_text_len
    out = tmp_path / "new" / "out.wav"
    result = synthesize("a" * (limit + 1), "--model-dir", model, "-o", out)
    assert result.exit_code == 2, result.output
    assert f"the text is {limit + 1} symbols after normalisation; this model reads at most {limit}" in result.output
    assert not out.parent.exists()


def test_texts_up_to_the_longest_text_of_any_bucket_are_accepted(shards_dir):
    """A bucket of shorter clips can hold longer texts than the largest bucket: the model reads those."""
    import dataclasses

    from melshards.shards_schema import read_schema
    from melshards.shards_schema.config import ConfigError

    one = read_schema(str(shards_dir))
    make = one.make_bucket
    schema = dataclasses.replace(one, buckets=(make(0, 40, 96, one.n_mels, []), make(1, 24, 192, one.n_mels, [])))
    assert schema.max_text_len == 24  # the largest bucket's
    ids, n = synthesize_module.padded_text_ids("a" * 40, schema)
    assert n == 40 and ids.shape == (1, 40) and (ids[0] > 1).all()
    with pytest.raises(ConfigError, match="the text is 41 symbols after normalisation; this model reads at most 40"):
        synthesize_module.padded_text_ids("a" * 41, schema)


def test_serving_refuses_a_text_longer_than_the_model_reads_instead_of_truncating(serve, speaking_model_dir):
    import tensorflow as tf

    from melshards.shards_schema import read_schema

    schema = read_schema(str(speaking_model_dir))
    limit = schema.max_text_len  # one bucket: the longest text of the run
    speaker, language = tf.constant(schema.speakers[0].name), tf.constant(schema.languages[0].code)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=f"the text is longer than the {limit} symbols this model reads"
    ):
        serve(text=tf.constant("a" * (limit + 1)), speaker=speaker, language=language)
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds no symbol of the vocabulary this model reads"):
        serve(text=tf.constant(""), speaker=speaker, language=language)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"holds symbols the vocabulary of this model lacks .* "
        r"they are:\] \[\u00e9 \u00e9\]",
    ):
        serve(text=tf.constant("\u00e9a\u00e9"), speaker=speaker, language=language)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"unknown language: this model was trained on 1 "
        r"language\(s\): en",
    ):
        serve(text=tf.constant("a"), speaker=speaker, language=tf.constant("fr"))
    out = serve(text=tf.constant("a" * limit), speaker=speaker, language=language)  # the longest still speaks
    assert int(out["mel_len"][0]) > 0


def test_several_speakers_need_speaker_and_language_and_unknown_names_are_refused(
    two_speakers_dir, tmp_path, monkeypatch
):
    """Before anything is loaded: no default among several, a name the model never saw names those it saw."""
    _refuse_loading(monkeypatch)
    model = _looks_trained(two_speakers_dir, tmp_path / "model")
    out = tmp_path / "new" / "out.wav"
    cases = [
        ((), "pass --speaker NAME: this model was trained on 2 speaker(s): 'anna', 'bert'"),
        (
            ("--speaker", "nobody"),
            "--speaker 'nobody' is not a speaker the model saw; this model was trained on 2 speaker(s): 'anna', 'bert'",
        ),
        (("--speaker", "bert"), "pass --language CODE: this model was trained on 2 language(s): 'de', 'en'"),
        (("--speaker", "bert", "--language", "fr"), "--language 'fr' is not a language the model saw"),
    ]
    for extra, message in cases:
        result = synthesize("Printing.", "--model-dir", model, "-o", out, *extra)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (extra, result.output)
    assert not out.parent.exists()


def test_the_only_speaker_and_language_are_the_defaults_and_many_names_are_cut_short(shards_dir):
    import dataclasses

    from melshards.shards_schema import Speaker, read_schema
    from melshards.shards_schema.config import ConfigError

    schema = read_schema(str(shards_dir))
    assert synthesize_module.pick_speaker(schema, None) == schema.speakers[0]
    assert synthesize_module.pick_language(schema, None) == schema.languages[0]
    code = schema.languages[0].code
    assert synthesize_module.pick_language(schema, code.upper()) == schema.languages[0]  # BCP 47 ignores case
    many = dataclasses.replace(
        schema,
        speakers=tuple(Speaker(i, f"s{i}", 1, 0.0) for i in range(12)),
        buckets=tuple(dataclasses.replace(b, groups={}) for b in schema.buckets),  # records per speaker: its clips
    )
    with pytest.raises(ConfigError, match=r"trained on 12 speaker\(s\): 's0', 's1', .*, 's7', \.\.\.$"):
        synthesize_module.pick_speaker(many, "s12")
    assert synthesize_module.pick_speaker(many, "s11").id == 11


@pytest.mark.parametrize("name", ["out.json", "out.flac", "out"])
def test_an_output_that_is_not_a_wav_path_is_refused_before_the_model_is_loaded(
    shards_dir, tmp_path, monkeypatch, name
):
    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model")
    result = synthesize("Printing.", "--model-dir", model, "-o", tmp_path / "new" / name)
    assert result.exit_code == 2, result.output
    assert f"-o {tmp_path / 'new' / name}: synthesize writes a WAV file; pass a path ending in .wav" in result.output
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("theirs", ["a recording of the user's", "schema.json"])
def test_synthesize_refuses_to_write_over_a_file_it_did_not_write(shards_dir, tmp_path, monkeypatch, theirs):
    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model")
    out = tmp_path / "take1.wav"
    if theirs == "schema.json":
        out.write_bytes((shards_dir / "schema.json").read_bytes())
    else:
        sf.write(out, [0.0] * 800, 16000, subtype="PCM_16")
    before = out.read_bytes()
    result = synthesize("Printing.", "--model-dir", model, "-o", out)
    assert result.exit_code == 2, result.output
    assert f"-o {out}: it exists and is not a WAV `melshards synthesize` wrote" in result.output
    assert out.read_bytes() == before


def test_synthesize_marks_its_wav_and_writes_over_its_own(spoken):
    """`spoken`: a second `melshards synthesize` (another process) to the -o of the first."""
    from melshards.shards_schema.ownership import WAV_SOFTWARE

    assert spoken["second"]["returncode"] == 0, spoken["second"]["stderr"]
    before, after = spoken["inodes"]
    assert after is not None and after != before  # written over: a new file moved onto the path
    with sf.SoundFile(spoken["wav"]) as f:
        assert f.software.startswith(WAV_SOFTWARE) and f.frames > 0


def test_the_same_text_gives_the_same_wav_in_two_processes(spoken):
    """`spoken`: synthesized by one process, then again by another to the same -o."""
    assert spoken["second"]["returncode"] == 0, spoken["second"]["stderr"]
    assert spoken["first"].read_bytes() == spoken["wav"].read_bytes()


def test_a_second_synthesis_in_a_new_process_loads_generate_from_the_persistent_cache(spoken):
    """`spoken`: the first process compiled generate into the cache MELSHARDS_XLA_CACHE names; the second,
    a new process, found it there: it compiled nothing (XLA dumped nothing) and added no entry."""
    from melshards.train.xla_cache import ENTRY

    assert spoken["second"]["returncode"] == 0, spoken["second"]["stderr"]
    assert spoken["cached"] and all(ENTRY.fullmatch(name) for name in spoken["cached"])
    assert spoken["cached_after"] == spoken["cached"]
    assert spoken["dumped"] == []


def test_a_cpu_run_prints_no_cuinit_error_unless_a_gpu_was_asked_for(spoken):
    """`spoken`'s second synthesis: `melshards synthesize` in a fresh process on this CPU, with neither
    TF_CPP_MIN_LOG_LEVEL nor CUDA_VISIBLE_DEVICES set."""
    second = spoken["second"]
    assert second["returncode"] == 0, second["stderr"]
    assert "cuInit" not in second["stderr"] and "cuda_platform" not in second["stderr"]


def test_a_synthesis_that_loads_its_program_from_the_cache_prints_no_cache_parse_error(spoken):
    """`spoken`'s second synthesis finds generate's program in the persistent XLA cache; TensorFlow's read of
    the entry logs a text-format parse error of it at ERROR level, which is dropped (train/tf_quiet.py)."""
    second = spoken["second"]
    assert second["returncode"] == 0 and spoken["cached_after"] == spoken["cached"], second["stderr"]
    assert "XlaSerializedCacheEntry" not in second["stderr"], second["stderr"]


def test_the_saved_model_holds_the_checkpoint_variables(speaking_model_dir, spoken):
    """`spoken`'s export holds the values the speaking model's checkpoint saved, every one."""
    import numpy as np
    import tensorflow as tf

    saved = saved_weights(speaking_model_dir)
    exported = tf.saved_model.load(str(spoken["export"]))
    values = [v.numpy() for v in exported.model_variables]
    assert len(values) == len(saved)
    assert [p for p, v in zip(saved, values) if not np.array_equal(saved[p], v)] == []


def test_synthesize_writes_a_playable_wav_and_exports_a_serving_signature(spoken, serve, speaking_model_dir):
    import numpy as np
    import tensorflow as tf

    from melshards.shards_schema import read_schema

    y, sr = sf.read(spoken["first"])
    schema = read_schema(str(speaking_model_dir))
    assert sr == schema.audio.sample_rate
    assert y.ndim == 1 and len(y) >= schema.mel.hop_length and np.isfinite(y).all() and np.abs(y).max() > 0
    out = serve(
        text=tf.constant("printing, in the only sense."),
        speaker=tf.constant(schema.speakers[0].name),
        language=tf.constant(schema.languages[0].code),
    )  # names, as schema.json has them
    assert out["mel"].shape == (1, schema.max_mel_frames, schema.n_mels)
    assert 0 < int(out["mel_len"][0]) <= schema.max_mel_frames
    assert (spoken["export"] / "melshards-export.json").is_file()  # so a later --export may write over it


def test_a_schema_that_no_longer_fits_the_checkpoint_is_one_line_naming_the_mismatch(speaking_model_dir, tmp_path):
    import json

    model = shutil.copytree(speaking_model_dir, tmp_path / "m")
    schema = json.loads((model / "schema.json").read_text())
    schema["vocabulary"].append("ж")  # another run's schema.json copied over the one training recorded
    (model / "schema.json").write_text(json.dumps(schema))
    out = tmp_path / "out.wav"
    result = synthesize("Printing.", "--model-dir", model, "-o", out)
    assert result.exit_code == 2, result.output
    assert f"{model / 'schema.json'} does not fit the checkpoint {model / 'checkpoints' / 'ckpt-10'}" in result.output
    assert "embeddings [" in result.output and "Put back the schema.json training recorded" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_wav_write_that_fails_is_exit_2_naming_the_path_and_leaves_the_old_wav(tmp_path, monkeypatch):
    import click
    import numpy as np

    from melshards.commands.synthesize import write_wav

    out = tmp_path / "out.wav"
    write_wav(str(out), np.ones(100, np.float32) * 0.5, 16000)
    before = out.read_bytes()

    def full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sf.SoundFile, "write", full)
    with pytest.raises(click.UsageError, match=f"-o {out}: cannot write it .*No space left on device"):
        write_wav(str(out), np.zeros(100, np.float32), 16000)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["out.wav"]


def test_a_file_put_at_o_while_the_model_spoke_is_not_written_over(tmp_path):
    import click
    import numpy as np

    from melshards.commands.synthesize import write_wav

    out = tmp_path / "out.wav"
    out.write_bytes(b"the user's recording, saved there after synthesize checked -o")
    with pytest.raises(click.UsageError, match=f"-o {out}: it exists and is not a WAV"):
        write_wav(str(out), np.zeros(100, np.float32), 16000)
    assert out.read_bytes().startswith(b"the user's") and [p.name for p in tmp_path.iterdir()] == ["out.wav"]


@pytest.mark.parametrize("theirs", ["a file", "a dir of the user's"])
def test_export_refuses_a_path_holding_what_it_did_not_write_before_the_model_is_loaded(
    shards_dir, tmp_path, monkeypatch, theirs
):
    _refuse_loading(monkeypatch)
    model = _looks_trained(shards_dir, tmp_path / "model")
    export = tmp_path / "export"
    if theirs == "a file":
        export.write_text("mine")
    else:
        export.mkdir()
        (export / "notes.txt").write_text("mine")
    result = synthesize("Printing.", "--model-dir", model, "-o", tmp_path / "out.wav", "--export", export)
    assert result.exit_code == 2, result.output
    assert f"--export {export}: it exists and is not a SavedModel dir" in " ".join(result.output.split())
    assert not (tmp_path / "out.wav").exists()
    assert (export.read_text() if theirs == "a file" else (export / "notes.txt").read_text()) == "mine"
