"""The reference-conditioned plug-in (examples/reference_tts.py) on an other_clip run (tests/conftest.py
`reference_runs`): its batches hold the stored references, it trains with one trace per bucket, and
`melshards synthesize --reference WAV` speaks with a reference cut by the preprocess mel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from melshards.commands.train import run
from tests.train.conftest import TEST_CONFIG, made

EXAMPLE = "examples.reference_tts:build"


@pytest.fixture(scope="module")
def reference_model(reference_runs, tmp_path_factory):
    _, (shards, _) = reference_runs
    tmp = tmp_path_factory.mktemp("reference_tts")
    cfg = {k: dict(v) for k, v in TEST_CONFIG.items()}
    cfg["model"] = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1}
    cfg["data"]["batch_size"] = 2
    cfg["loop"].update(steps=6, checkpoint_every=6, log_every=2, val_every=6, jit_compile=False)
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    model_dir = tmp / "model"
    args = [str(shards / "train-*.tfrecord"), "--val", str(shards / "val-*.tfrecord"), "--model-dir", str(model_dir)]
    assert run([*args, "--config", str(tmp / "c.yaml"), "--model", EXAMPLE]) == 0
    return model_dir, json.loads((model_dir / "run_summary.json").read_text())


def test_the_reference_model_trains_on_stored_references_with_one_trace_per_bucket(reference_model):
    _, summary = reference_model
    losses = summary["final_losses"]["train"]
    assert set(losses) == {"loss", "mel_loss", "length_loss"} and all(np.isfinite(v) for v in losses.values())
    assert summary["steps_run"] == 6
    assert set(made(summary)) <= {0, 1} and summary["buckets_used"] >= 1


def test_a_model_asking_for_reference_mel_gets_it_and_its_length():
    from melshards.train.plugins import model_inputs

    assert model_inputs(EXAMPLE)[-2:] == ("reference_mel", "reference_len")


def test_synthesis_speaks_with_a_reference_wav_through_the_preprocess_mel(reference_model, corpus_dir):
    """`melshards synthesize --reference WAV`'s path: the WAV's reference by the preprocess mel
    (`reference_from`), then the model's generate with it; another reference gives another voice. (Six
    steps do not teach the length head to speak long enough for Griffin-Lim, so the WAV is not written.)"""
    from melshards.commands.synthesize import reference_from
    from melshards.shards_schema import read_schema
    from melshards.train.synthesize import load_synthesizer, normalise, padded_text_ids

    model_dir, _ = reference_model
    schema = read_schema(str(model_dir / "schema.json"))
    wavs = sorted((corpus_dir / "wavs").glob("*.wav"))
    first, second = reference_from(str(wavs[0]), schema), reference_from(str(wavs[5]), schema)
    assert first[0].shape == (40, 80) and 0 < first[1] <= 40 and first[0].dtype == np.float16
    synth = load_synthesizer(str(model_dir))
    ids, n = padded_text_ids(normalise("Hello there.", schema.languages[0]), schema)
    a = synth.speak(ids, n, schema.speakers[0], schema.languages[0], first)
    b = synth.speak(ids, n, schema.speakers[0], schema.languages[0], second)
    assert a["mel"].shape == b["mel"].shape == (1, schema.max_mel_frames, 80)
    assert not np.array_equal(a["mel"].numpy(), b["mel"].numpy())


# -- the reference's front end: the run's, as schema.json records it ----------------------------------

FRONT_END = {"trim_method": "webrtcvad", "vad_aggressiveness": 3, "loudness_target_lufs": -16.0, "trim_top_db": 30.0}


def test_every_front_end_setting_a_run_applies_to_the_audio_comes_back_from_its_schema():
    """`report.audio_params` writes what the front end did, `report.front_end` reads it back for
    `synthesize --reference`: each AudioConfig field off its default survives schema.json (JSON included),
    but silence_peak_dbfs, which rejects clips and changes none."""
    import dataclasses

    from melshards.preprocess.config import AudioConfig, MelConfig, PreprocessConfig
    from melshards.preprocess.write.report import audio_params, front_end, mel_params
    from melshards.shards_schema.schema import SCHEMA_VERSION, AudioParams, Schema

    audio = AudioConfig(sample_rate=16000, trim_silence=True, silence_peak_dbfs=-40.0, **FRONT_END)
    assert {f.name for f in dataclasses.fields(AudioConfig) if getattr(audio, f.name) == f.default} == {
        "trim_silence"  # its default, True, is the only value under which the others apply
    }
    mel = MelConfig(n_fft=512, hop_length=128, win_length=400, n_mels=40, fmax=7000.0, log_floor=1e-4, power=2.0)
    cfg = PreprocessConfig(audio=audio, mel=mel)
    bucket = Schema.make_bucket(0, 8, 16, 40, [])
    schema = Schema(
        SCHEMA_VERSION, audio_params(audio), mel_params(mel), ("<pad>",), (), (), (0.0,) * 40, (1.0,) * 40, 8, (bucket,)
    )
    back = front_end(Schema.from_json(schema.to_json()))
    assert back.mel == cfg.mel
    assert back.audio == dataclasses.replace(cfg.audio, silence_peak_dbfs=AudioConfig().silence_peak_dbfs)
    energy = dataclasses.replace(audio, trim_method="energy")
    assert audio_params(energy).vad_aggressiveness is None  # the energy trim reads no aggressiveness
    assert front_end(dataclasses.replace(schema, audio=audio_params(energy))).audio.trim_method == "energy"
    old = dataclasses.replace(schema, version="3.3.0", audio=AudioParams(16000, True, 30.0, trim_method="webrtcvad"))
    from melshards.shards_schema import SchemaError

    with pytest.raises(SchemaError, match="does not record the webrtcvad aggressiveness"):
        front_end(old)


@pytest.fixture(scope="module")
def front_end_run(corpus_dir, tmp_path_factory):
    """Six clips preprocessed through a front end off its defaults (`FRONT_END`: webrtcvad trim at
    aggressiveness 3, loudness normalised to -16 LUFS), with same_clip references of 40 frames."""
    import csv

    from melshards.commands.preprocess import run as preprocess

    tmp = tmp_path_factory.mktemp("front_end")
    texts = dict(line.split("|")[:2] for line in (corpus_dir / "metadata.csv").read_text().splitlines() if "|" in line)
    ids = ["LJT001-0001", "LJT001-0004", "LJT001-0008", "LJT001-0010", "LJT001-0011", "LJT001-0012"]
    with (tmp / "corpus.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["audio", "text", "id", "speaker"])
        w.writeheader()
        w.writerows(
            {"audio": str(corpus_dir / "wavs" / f"{c}.wav"), "text": texts[c], "id": c, "speaker": "anna"} for c in ids
        )
    config = {
        "audio": FRONT_END,
        "filter": {"mel_frames_upper_percentile": 100.0, "text_len_upper_percentile": 100.0},
        "split": {"val_fraction": 0.0},
        "pad": {"buckets": 1, "min_bucket_records": 1},
        "reference": {"source": "same_clip", "frames": 40},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(config))
    args = ["--input", str(tmp / "corpus.csv"), "--output", str(tmp / "out"), "--config", str(tmp / "cfg.yaml")]
    assert preprocess([*args, "--language", "en", "--workers", "1"]) == 0
    return tmp / "out", {c: corpus_dir / "wavs" / f"{c}.wav" for c in ids}


def test_a_reference_wav_gets_the_log_mel_the_run_wrote_for_that_clip(front_end_run):
    """`synthesize --reference` computes a WAV's log-mel through the run's front end (its trim, its
    loudness target): a clip of the run gives exactly the frames its record holds."""
    from melshards.commands.synthesize import reference_from
    from tests.preprocess.conftest import decoded_records

    out, wavs = front_end_run
    schema, records = decoded_records(out)
    assert (schema.audio.trim_method, schema.audio.vad_aggressiveness, schema.audio.loudness_target_lufs) == (
        "webrtcvad",
        3,
        -16.0,
    )
    assert len(records) == len(wavs)
    for r in records:
        mel, valid = reference_from(str(wavs[r["id"].numpy()[0].decode()]), schema)
        assert valid == min(40, int(r["mel_len"][0]))
        np.testing.assert_array_equal(mel[:valid].astype(np.float32), r["mel"][0, :valid].numpy())
