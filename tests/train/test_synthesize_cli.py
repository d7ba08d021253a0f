"""`melshards synthesize` refuses what it cannot do with exit 2 and a reason, before the slow work."""
from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner, Result

from preprocess.clips import ClipRejected, prepare_text
from shards_schema import Vocabulary
from tests.train.conftest import write_config
from melshards.train_cli import run
from train import synthesize as synthesize_module
from melshards.synthesize_cli import synthesize_command

FIX = "pass the --model-dir of a `melshards train` run"


@pytest.fixture(scope="module")
def model_dir(four_records, tmp_path_factory) -> Path:
    """A trained tiny model: enough steps on 4 records that its stop token has learnt something."""
    tmp = tmp_path_factory.mktemp("synth")
    cfg = write_config(tmp / "c.yaml", loop={"steps": 60, "steps_per_execution": 2, "checkpoint_every": 60,
                                             "log_every": 30})
    assert run([str(four_records / "train-*.tfrecord"), "--model-dir", str(tmp / "model"), "--config", str(cfg)]) == 0
    return tmp / "model"


def synthesize(*args) -> Result:
    result = CliRunner().invoke(synthesize_command, [str(a) for a in args])
    # an error must be a message and an exit code, never a traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.mark.parametrize("text", ["--- !!! ???", "   "])
def test_text_preprocess_would_reject_is_refused_with_the_same_reason(model_dir, tmp_path, text):
    with pytest.raises(ClipRejected) as rejected:
        prepare_text(text, Vocabulary())
    wav = tmp_path / "out.wav"
    result = synthesize("--model-dir", model_dir, "-o", wav, "--", text)  # "--": the text starts with "-"
    assert result.exit_code == 2, result.output
    assert f"({rejected.value.reason})" in result.output and "melshards preprocess" in result.output
    assert not wav.exists()


def test_output_into_a_missing_directory_creates_it(model_dir, tmp_path):
    wav = tmp_path / "new" / "deeper" / "out.wav"
    result = synthesize("Printing, in the only sense.", "--model-dir", model_dir, "-o", wav,
                        "--griffin-lim-iters", "1")
    assert result.exit_code == 0, result.output
    y, _ = sf.read(wav)
    assert y.ndim == 1 and len(y) > 0


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

    def load_synthesizer(model_dir):
        raise AssertionError("the model was loaded before --griffin-lim-iters was checked")

    monkeypatch.setattr(synthesize_module, "load_synthesizer", load_synthesizer)
    wav = tmp_path / "new" / "out.wav"
    result = synthesize("Printing.", "--model-dir", looks_trained, "-o", wav, "--griffin-lim-iters", iters)
    assert result.exit_code == 2, result.output
    assert "--griffin-lim-iters" in result.output
    assert not wav.parent.exists()
