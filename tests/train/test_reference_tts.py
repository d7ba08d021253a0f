"""The reference-conditioned plug-in (examples/reference_tts.py) on an other_clip run (tests/conftest.py
`reference_runs`): its batches hold the stored references, it trains with one trace per bucket, and
`melshards synthesize --reference WAV` speaks with a reference cut by the preprocess mel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from melshards.commands.train import run
from tests.train.conftest import TEST_CONFIG

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
    assert {b["train_step_traces"] for b in summary["buckets"]} <= {0, 1} and summary["buckets_used"] >= 1


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
