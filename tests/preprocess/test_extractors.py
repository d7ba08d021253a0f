"""Per-clip extractors (docs/preprocess.md, Extractors you plug in): the declarations, padding and
centroids as pure functions; the SavedModel adapter on a tiny model; then one small run with a tiny ONNX
embedding, a Python codec stand-in and a Python per-frame extractor that fails on one clip, its cached
re-run, and a plug-in trained on the embedding."""

from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest
import soundfile as sf
import yaml

from melshards.preprocess.clip import cache, extractor_plugins, features
from melshards.preprocess.config import ExtractorConfig, PreprocessConfig
from melshards.preprocess.stats import feature_stats
from melshards.shards_schema import read_schema
from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.extracted import ExtractorOutput, token_capacity
from melshards.shards_schema.schema import SCHEMA_VERSION, Schema, SchemaError
from tests.conftest import CORPUS, REPO
from tests.preprocess.conftest import tone

# -- declarations and padding ---------------------------------------------------------------------


def test_token_capacity_is_the_exact_ceiling_of_the_mel_frames_seconds():
    # 100 frames * 256 / 22050 Hz = 1.16099... s; at 50 tokens/s: 58.049... -> 59
    assert token_capacity(100, 256, 22050, 50.0) == 59
    # exactly 2 s (250 frames * 128 / 16000) at 75/s: 150, not 151 from a float hair above
    assert token_capacity(250, 128, 16000, 75.0) == 150
    assert token_capacity(250, 128, 16000, 12.5) == 25


def test_each_kind_declares_its_bucket_shapes_and_storage():
    vec = ExtractorOutput("spk", "vector", "float32", dim=3)
    frames = ExtractorOutput("loud", "frames", "float16", dim=2)
    tokens = ExtractorOutput("codes", "tokens", "int16", dim=8, frame_rate=50.0)
    got = [(f.name, f.dtype, f.shape, f.storage) for o in (vec, frames, tokens) for f in o.features(100, 256, 22050)]
    assert got == [
        ("spk", "float32", (3,), "raw_float32"),
        ("loud", "float32", (100, 2), "raw_float16"),
        ("codes", "int32", (59, 8), "raw_int16"),
        ("codes_len", "int32", (), "int64"),
    ]


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"kind": "vector"}, "dim 0"),
        ({"kind": "tokens"}, "frame_rate 0.0"),
        ({"kind": "frames", "frame_rate": 10.0}, "frame_rate 10.0"),
        ({"kind": "pixels"}, "kind 'pixels'"),
        ({"kind": "frames", "dtype": "float64"}, "dtype 'float64'"),
    ],
)
def test_a_bad_declaration_is_refused_naming_what_is_wrong(kwargs, problem):
    with pytest.raises(SchemaError, match=problem):
        ExtractorOutput("x", **kwargs)


def test_outputs_are_checked_against_the_declaration_and_the_clip():
    vec = ExtractorOutput("spk", "vector", dim=3)
    frames = ExtractorOutput("loud", "frames")
    tokens = ExtractorOutput("codes", "tokens", "int16", frame_rate=50.0)
    assert vec.check([1, 2], 10, 256, 22050)[1] == "spk: 2 values, declared 3"
    assert vec.check([[1, 2, 3]], 10, 256, 22050)[1] == "spk: shape (1, 3), declared vector [3]"
    assert frames.check(np.zeros(9), 10, 256, 22050)[1] == "loud: 9 frames, the clip has 10 mel frames"
    assert frames.check([0.0, np.nan], 2, 256, 22050)[1] == "loud: non-finite values"
    # 100 mel frames hold 59 tokens at 50/s
    assert tokens.check(np.zeros(60), 100, 256, 22050)[1] == "codes: 60 tokens, 100 mel frames hold 59 at 50.0/s"
    assert tokens.check([40000], 100, 256, 22050)[1] == "codes: values outside int16 [-32768, 32767]"
    assert tokens.check([1.5], 100, 256, 22050)[1] == "codes: non-integer values for dtype int16"
    value, problem = tokens.check([3.0, 4.0], 100, 256, 22050)
    assert problem is None and value.dtype == np.int16 and value.tolist() == [3, 4]


def test_padding_fills_each_kind_to_the_bucket_with_its_pad_value():
    tokens = ExtractorOutput("codes", "tokens", "int16", frame_rate=50.0, pad=-1)
    out = tokens.padded(np.array([5, 6], np.int16), 4, 256, 22050)  # 4 frames: ceil(2.32) = 3 tokens
    assert out["codes"].tolist() == [5, 6, -1] and out["codes_len"] == 2
    frames = ExtractorOutput("loud", "frames", dim=2)
    assert frames.padded(np.ones((1, 2), np.float32), 3, 256, 22050)["loud"].tolist() == [[1, 1], [0, 0], [0, 0]]
    vec = ExtractorOutput("spk", "vector", dim=2)
    assert vec.padded(np.array([1.5, 2.5], np.float32), 3, 256, 22050)["spk"].tolist() == [1.5, 2.5]


def test_centroids_are_the_mean_of_training_vectors_else_validation():
    def summary(v):
        return features.clip_summary({"spk": np.array(v, np.float32)}, ("spk",))

    clips = [
        ({"speaker": "a", "language": "en", "split": "train"}, summary([1.0, 2.0])),
        ({"speaker": "a", "language": "en", "split": "train"}, summary([3.0, 6.0])),
        ({"speaker": "a", "language": "en", "split": "val"}, summary([100.0, 100.0])),
        ({"speaker": "b", "language": "en", "split": "val"}, summary([0.5, -0.25])),
    ]
    acc = feature_stats.merge([feature_stats.batch_stats(clips[:2]), feature_stats.batch_stats(clips[2:])])
    out = feature_stats.finish(acc, ())
    assert out["centroids"] == {"a": {"spk": [2.0, 4.0]}, "b": {"spk": [0.5, -0.25]}}


class _Flaky:
    """Fails on a batch holding a clip of length 3, and on that clip alone."""

    name, version, sample_rate = "flaky", "1", 22050
    outputs = ({"name": "spk", "kind": "vector", "dim": 1},)

    def __call__(self, clips):
        if any(len(y) == 3 for y in clips):
            raise RuntimeError("bad clip")
        return [{"spk": [float(len(y))]} for y in clips]


def test_a_failing_batch_is_retried_clip_by_clip_so_only_the_bad_clip_fails():
    loaded = extractor_plugins.Loaded(_Flaky(), (ExtractorOutput("spk", "vector", dim=1),), {"name": "flaky"}, 8)
    runner = extractor_plugins.Extractors([])
    runner._loaded = [loaded]
    results = runner.apply([np.zeros(2), np.zeros(3), np.zeros(5)], [1, 1, 1], 22050, 256)
    assert [r if isinstance(r, str) else r["spk"].tolist() for r in results] == [
        [2.0],
        "flaky: RuntimeError: bad clip",
        [5.0],
    ]


def _extractor_key(cfg: PreprocessConfig, records: list[dict]) -> str:
    (part,) = [p for p in cache.run_parts(cfg, records) if p.extractor is not None]
    return part.settings


class _Down:
    """An extractor whose model server is down: every call raises."""

    name, version, sample_rate = "remote", "1", 22050
    outputs = ({"name": "spk", "kind": "vector", "dim": 1},)

    def __call__(self, clips):
        raise ConnectionError("[Errno 111] Connection refused")


def _runner(extractor, batch_size: int = 8) -> extractor_plugins.Extractors:
    runner = extractor_plugins.Extractors([])
    runner._loaded = [extractor_plugins.Loaded(extractor, _outputs_of(extractor), {"name": extractor.name}, batch_size)]
    return runner


def _outputs_of(extractor) -> tuple[ExtractorOutput, ...]:
    return tuple(ExtractorOutput(**o) for o in extractor.outputs)


def test_more_than_half_of_the_last_100_clips_failing_once_20_were_given_stops_the_job():
    def stops(failed: list[bool]) -> bool:
        return extractor_plugins.too_many_failures(failed)

    assert not stops([True] * 19)  # too few to judge
    assert stops([True] * 20) and stops([False] * 9 + [True] * 11)
    assert not stops([False] * 10 + [True] * 10)  # half is not more than half
    assert not stops([False] * 1000 + [True] * 50)  # the last 100: 50 failed
    assert stops([False] * 1000 + [True] * 51)  # a server gone down mid-run
    assert not stops(([False] * 9 + [True]) * 30)  # a clip in ten it cannot take: each rejected


def test_an_extractor_that_fails_every_clip_stops_the_job_naming_it_and_its_first_error():
    runner = _runner(_Down())
    clips = [np.zeros(100, np.float32)] * 8
    for _ in range(2):  # 16 clips given: each rejected, as a clip it fails on
        assert (
            runner.apply(clips, [1] * 8, 22050, 256) == ["remote: ConnectionError: [Errno 111] Connection refused"] * 8
        )
    with pytest.raises(extractor_plugins.ExtractorFailing) as e:
        runner.apply(clips, [1] * 8, 22050, 256)
    assert str(e.value).startswith(
        "extractor 'remote' failed on 24 of the last 24 clips a worker gave it, the first with: "
        "ConnectionError: [Errno 111] Connection refused; the job stopped"
    )
    assert isinstance(e.value, ConfigError)  # the command's one line (no traceback)
    flaky = _runner(_Flaky())
    for _ in range(40):  # one clip in three fails: rejected, the job goes on
        assert isinstance(flaky.apply([np.zeros(2), np.zeros(3), np.zeros(5)], [1] * 3, 22050, 256)[1], str)


def test_a_run_whose_extractor_fails_every_clip_stops_with_one_line_and_publishes_nothing(tmp_path, capsys):
    from melshards.commands.preprocess import run
    from tests.conftest import CORPUS

    (tmp_path / "cfg.yaml").write_text(
        yaml.safe_dump(
            {"extractors": [{"factory": "examples.extractors:frame_loudness", "options": {"fail_above_s": 0.1}}]}
        )
    )
    out = tmp_path / "out"
    args = ["--input", str(CORPUS), "--output", str(out), "--config", str(tmp_path / "cfg.yaml"), "--workers", "1"]
    assert run(args) == 2
    printed = capsys.readouterr()
    errors = [line for line in (printed.out + printed.err).splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in printed.out + printed.err
    assert errors[0].startswith(
        "Error: extractor 'frame_loudness' failed on 20 of the last 20 clips a worker gave it, the first with: "
        "ValueError: clip of "
    )
    assert not list(out.iterdir())  # nothing published, no staging dir left


def test_the_failing_extractor_is_found_in_what_a_local_job_raises_with_or_without_worker_processes():
    """In this process Beam re-raises the error with where it ran; from a worker process it is a
    RuntimeError holding the worker's traceback as text."""
    message = "extractor 'remote' failed on 20 of the last 20 clips a worker gave it, the first with: x; fix it"
    augmented = extractor_plugins.ExtractorFailing(message + " [while running 'Measure/Measure/ParDo(_MeasureFn)']")
    text = (
        'Traceback (most recent call last):\n  File "extractor_plugins.py", line 250, in check\n    raise ExtractorFailing(\n'
        f"melshards.preprocess.clip.extractor_plugins.ExtractorFailing: {message} [while running 'Measure/ParDo(_MeasureFn)']\n"
    )
    from melshards.preprocess.job.run import input_error

    for raised in (augmented, RuntimeError(text)):
        found = input_error(raised)
        assert isinstance(found, extractor_plugins.ExtractorFailing) and str(found) == message
    try:
        raise RuntimeError("the job failed") from RuntimeError(text)
    except RuntimeError as e:
        assert str(input_error(e)) == message
    assert input_error(RuntimeError("ExtractorFailing: not ours")) is None


def test_other_extractor_weights_change_the_cache_key_and_the_contract():
    cfg = dataclasses.replace(PreprocessConfig(), extractors=(ExtractorConfig("e:e"),))
    record = {"name": "e", "version": "1", "fingerprint": "aa", "options": {}, "sample_rate": 16000, "outputs": []}
    other = dict(record, fingerprint="bb")
    assert _extractor_key(cfg, [record]) != _extractor_key(cfg, [other])
    with pytest.raises(extractor_plugins.ExtractorError, match="different extractors"):
        extractor_plugins.same_records([record], [other])
    assert extractor_plugins.same_records([], [record]) == [record]


def test_an_extractors_options_are_in_its_record_its_cache_key_and_the_contract():
    """examples.extractors:frame_loudness with `hop` 256 and 512 gives 87 and 44 frames of one clip: the
    two are other keys (a warm cache never serves one for the other) and other shards."""
    hops = [
        extractor_plugins.load(ExtractorConfig("examples.extractors:frame_loudness", {"hop": h})) for h in (256, 512)
    ]
    y = tone(1.0)
    assert [len(x.extractor([y])[0]["loudness"]) for x in hops] == [87, 44]
    records = [x.record for x in hops]
    assert [r["options"] for r in records] == [{"hop": 256}, {"hop": 512}]
    assert records[0]["fingerprint"] == records[1]["fingerprint"]  # the same code
    cfg = dataclasses.replace(PreprocessConfig(), extractors=(ExtractorConfig("examples.extractors:frame_loudness"),))
    assert _extractor_key(cfg, records[:1]) != _extractor_key(cfg, records[1:])
    schema = _schema_with(records[0])
    assert schema.extractors[0]["options"] == {"hop": 256}
    with pytest.raises(SchemaError, match="extractors"):
        schema.check_compatible(_schema_with(records[1]), "a", "b")
    with pytest.raises(extractor_plugins.ExtractorError, match="options .* recorded in schema.json"):
        extractor_plugins.recorded_options(ExtractorConfig("examples.extractors:frame_loudness", {"hop": object()}))


def _schema_with(record: dict) -> Schema:
    """A one-bucket schema whose run had the extractor `record`."""
    from melshards.preprocess.write.report import mel_params
    from melshards.shards_schema import AudioParams

    outputs = tuple(ExtractorOutput(**o) for o in record["outputs"])
    bucket = Schema.make_bucket(0, 8, 16, 80, [], hop_length=256, extracted=outputs, sample_rate=22050)
    return Schema(
        SCHEMA_VERSION,
        AudioParams(22050, True, 40.0),
        mel_params(PreprocessConfig().mel),
        ("<pad>", "<eos>"),
        (),
        (),
        (0.0,) * 80,
        (1.0,) * 80,
        8,
        (bucket,),
        extractors=(record,),
    )


def test_an_extractor_whose_factory_does_not_exist_stops_with_one_line():
    with pytest.raises(extractor_plugins.ExtractorError, match="has no 'nope'"):
        extractor_plugins.load(ExtractorConfig("examples.extractors:nope"))
    with pytest.raises(extractor_plugins.ExtractorError, match="already a record feature"):
        extractor_plugins.check_names(
            [extractor_plugins.load(ExtractorConfig("examples.extractors:frame_loudness"))], ["loudness"]
        )


def test_the_saved_model_adapter_runs_a_savedmodel_and_fingerprints_its_files(tmp_path):
    from examples.extractors import CODEC_HOP, RmsCodes, build_saved_model_codec
    from melshards.extractors import saved_model

    path = build_saved_model_codec(tmp_path / "codec")
    options = {
        "path": str(path),
        "name": "tiny_codec",
        "sample_rate": 16000,
        "outputs": [{"name": "codes", "kind": "tokens", "dtype": "int16", "frame_rate": 50.0}],
    }
    codec = saved_model(**options)
    y = tone(1.0, sr=16000)[: 10 * CODEC_HOP + 7]
    (out,) = codec([y])
    assert out["codes"].tolist() == RmsCodes()([y])[0]["codes"].tolist() and len(out["codes"]) == 10
    assert len(codec.fingerprint) == 64
    (path / "extra.txt").write_bytes(b"x")
    assert saved_model(**options).fingerprint != codec.fingerprint  # every file's bytes count


# -- a bad extractor entry, through the command: one line each ---------------------------------------


class _NoOutputs:
    name, version, sample_rate = "no_outputs", "1", 22050

    def __call__(self, clips):
        return [{} for _ in clips]


class _BadRate(_Flaky):
    name, sample_rate = "bad_rate", 0


def broken(how: str):
    """An extractor factory that fails as `how` says, in a way only building it shows."""
    if how == "raises":
        raise RuntimeError("model server down")
    return {"returns None": None, "lacks outputs": _NoOutputs(), "bad rate": _BadRate()}[how]


def takes_hop(hop: int = 256, *, sample_rate: int = 22050):
    return _Flaky()


BROKEN = f"{__name__}:broken"


def _preprocess_with(tmp_path, capsys, *entries: dict) -> tuple[int, list[str], str]:
    """`melshards preprocess` of the shipped corpus with these extractor entries -> (exit code, its
    `Error:` lines, its stderr)."""
    from melshards.commands.preprocess import run

    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"extractors": list(entries)}))
    out = tmp_path / "out"
    code = run(["--input", str(CORPUS), "--output", str(out), "--config", str(tmp_path / "cfg.yaml"), "--workers", "1"])
    err = capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir()), "a failed run left files in --output"
    return code, [line for line in err.splitlines() if line.startswith("Error:")], err


@pytest.mark.parametrize(
    "entries, says",
    [
        (
            [{"factory": "examples.extractors.frame_loudness"}],
            "is not of the form package.module:function (e.g. melshards.extractors:onnx_model); "
            "did you mean 'examples.extractors:frame_loudness'?",
        ),
        ([{"factory": "examples.extractor:frame_loudness"}], "module 'examples.extractor' does not import"),
        ([{"factory": "examples.extractors:frame_loudnes"}], "has no 'frame_loudnes'"),
        (
            [{"factory": f"{__name__}:takes_hop", "options": {"hopp": 512}}],
            "has no option 'hopp': did you mean 'hop'? (it takes hop, sample_rate)",
        ),
        ([{"factory": "examples.extractors:rms_codes"}] * 2, "entries 1 and 2 are the same extractor"),
    ],
    ids=["no colon", "does not import", "not in its module", "unknown option", "given twice"],
)
def test_an_extractor_entry_the_config_shows_wrong_is_refused_in_one_line_before_the_job(
    tmp_path, capsys, entries, says
):
    code, errors, err = _preprocess_with(tmp_path, capsys, *entries)
    assert code == 2 and len(errors) == 1 and says in errors[0], err
    assert "Traceback" not in err and " INFO " not in err, err  # refused before the run took --output


FAILS_TO_BUILD = {
    "raises": f"extractor factory {BROKEN!r} failed with options {{'how': 'raises'}}: RuntimeError: model server down",
    "returns None": f"extractor factory {BROKEN!r} returned a NoneType without name, version, sample_rate, outputs",
    "lacks outputs": f"extractor factory {BROKEN!r} returned a _NoOutputs without outputs",
    "bad rate": "extractor 'bad_rate': sample_rate 0 must be a positive integer",
}


@pytest.mark.parametrize("how", sorted(FAILS_TO_BUILD))
def test_an_extractor_that_fails_to_build_is_an_extractor_error_saying_what_is_wrong(how):
    """What the job says when an extractor fails to build: `extractor_plugins.load`, which the job calls."""
    with pytest.raises(extractor_plugins.ExtractorError) as e:
        extractor_plugins.load(ExtractorConfig(BROKEN, {"how": how}))
    assert str(e.value).startswith(FAILS_TO_BUILD[how])


def test_an_extractor_that_fails_to_build_in_the_job_stops_it_with_one_line_naming_it(tmp_path, capsys):
    """One job run, with the factory whose own error is the ExtractorError's cause: each way of failing to
    build is an ExtractorError from `extractor_plugins.load` (the test above), which the job tells alike."""
    code, errors, err = _preprocess_with(tmp_path, capsys, {"factory": BROKEN, "options": {"how": "raises"}})
    assert code == 2 and len(errors) == 1 and errors[0].startswith(f"Error: {FAILS_TO_BUILD['raises']}"), err
    assert "while running" not in errors[0] and "Traceback" not in err and "Worker:" not in err, err


# -- one small run ------------------------------------------------------------------------------------

SPEAKERS = {
    "anna": ["LJT001-0001", "LJT001-0004", "LJT001-0008", "LJT001-0010"],
    "bert": ["LJT001-0011", "LJT001-0012", "LJT001-0013"],
}
LONG_TONE = "tone-long"  # 6 s: frame_loudness (fail_above_s 5) fails on it


@pytest.fixture(scope="module")
def runs(corpus_dir, tmp_path_factory):
    """The same manifest preprocessed twice with one feature cache: computed, then read from the cache.
    The SavedModel adapter is tested on its own (`test_the_saved_model_adapter_...`): TensorFlow in the
    job would need the job in a subprocess (the local job forks, this process runs TensorFlow)."""
    from examples.extractors import build_onnx_embedding
    from melshards.commands.preprocess import run

    tmp = tmp_path_factory.mktemp("extractors")
    texts = dict(line.split("|")[:2] for line in (corpus_dir / "metadata.csv").read_text().splitlines() if "|" in line)
    rows = [
        {"audio": str(corpus_dir / "wavs" / f"{c}.wav"), "text": texts[c], "id": c, "speaker": s, "language": "en"}
        for s, clips in SPEAKERS.items()
        for c in clips
    ]
    sf.write(tmp / "tone.wav", tone(6.0), 22050)
    rows.append(
        {"audio": str(tmp / "tone.wav"), "text": "A long tone.", "id": LONG_TONE, "speaker": "anna", "language": "en"}
    )
    with (tmp / "corpus.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    onnx_path = build_onnx_embedding(tmp / "embedding.onnx")
    config = {
        "filter": {"mel_frames_lower_percentile": 0.0, "mel_frames_upper_percentile": 100.0},
        "split": {"val_fraction": 0.25},
        "pad": {"buckets": 1, "min_bucket_records": 1},
        "extractors": [
            {
                "factory": "melshards.extractors:onnx_model",
                "options": {
                    "path": str(onnx_path),
                    "name": "tiny_embedding",
                    "sample_rate": 16000,
                    "outputs": [{"name": "speaker_embedding", "kind": "vector", "dim": 4}],
                },
            },
            {"factory": "examples.extractors:rms_codes"},
            {"factory": "examples.extractors:frame_loudness", "options": {"fail_above_s": 5.0}},
        ],
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(config))
    outs = []
    for name in ("first", "again"):
        out = tmp / name
        args = ["--input", str(tmp / "corpus.csv"), "--output", str(out), "--config", str(tmp / "cfg.yaml")]
        assert run([*args, "--cache", str(tmp / "cache"), "--workers", "1"]) == 0
        outs.append(out)
    return outs


def _records(out) -> dict[str, dict]:
    import tensorflow as tf

    schema = read_schema(str(out))
    found = {}
    for path in sorted(out.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(path)):
            example = tf.train.Example.FromString(raw.numpy())
            stored = {k: v for k, v in example.features.feature.items()}
            key = stored["id"].bytes_list.value[0].decode()
            found[key] = {"raw": stored, "split": "val" if "/val-" in str(path) else "train"}
    from melshards.shards_schema.records import decode_parsed, parse_spec

    for rec in found.values():
        raw = tf.train.Example(features=tf.train.Features(feature=rec["raw"])).SerializeToString()
        parsed = decode_parsed(schema, tf.io.parse_example([raw], parse_spec(schema)), 1)
        rec["values"] = {k: v.numpy()[0] for k, v in parsed.items()}
    return found


def test_the_records_hold_each_extractors_outputs_in_the_buckets_shapes(runs):
    schema = read_schema(str(runs[0]))
    assert [x["name"] for x in schema.extractors] == ["tiny_embedding", "rms_codes", "frame_loudness"]
    b = schema.largest
    assert b.feature("speaker_embedding").shape == (4,)
    assert b.feature("codes").shape == (token_capacity(b.max_mel_frames, 256, 22050, 50.0),)
    assert b.feature("loudness").shape == (b.max_mel_frames,)
    records = _records(runs[0])
    assert len(records) == 7
    for rec in records.values():
        v = rec["values"]
        n, t = int(v["mel_len"]), int(v["codes_len"])
        assert 0 < t <= token_capacity(n, 256, 22050, 50.0)
        assert not v["codes"][t:].any() and not v["loudness"][n:].any() and v["loudness"][:n].all()
        assert np.isfinite(v["speaker_embedding"]).all()


def test_the_schema_records_each_extractors_fingerprint_and_its_outputs(runs):
    schema = read_schema(str(runs[0]))
    embedding, codec, loudness = schema.extractors
    assert embedding["factory"] == "melshards.extractors:onnx_model" and embedding["version"] == "1"
    assert len({x["fingerprint"] for x in schema.extractors}) == 3
    assert all(len(x["fingerprint"]) == 64 for x in schema.extractors)
    assert codec["outputs"][0]["frame_rate"] == 50.0 and loudness["outputs"][0]["kind"] == "frames"
    assert loudness["options"] == {"fail_above_s": 5.0} and codec["options"] == {}
    assert embedding["options"]["name"] == "tiny_embedding" and embedding["options"]["sample_rate"] == 16000
    other = json.loads(schema.to_json())
    other["extractors"][0]["fingerprint"] = "0" * 64
    with pytest.raises(SchemaError, match="extractors"):
        schema.check_compatible(Schema.from_dict(other), "a", "b")


def test_each_speakers_centroid_is_the_mean_of_its_training_embeddings(runs):
    schema, records = read_schema(str(runs[0])), _records(runs[0])
    for speaker in schema.speakers:
        mine = [
            r["values"]["speaker_embedding"]
            for r in records.values()
            if r["values"]["speaker"].decode() == speaker.name
        ]
        train = [
            r["values"]["speaker_embedding"]
            for r in records.values()
            if r["values"]["speaker"].decode() == speaker.name and r["split"] == "train"
        ]
        assert mine and train
        expected = np.mean(np.asarray(train, np.float64), axis=0)
        assert speaker.centroids["speaker_embedding"] == [round(float(x), 6) for x in expected]
        assert set(speaker.centroids) == {"speaker_embedding"}


def test_a_clip_an_extractor_fails_on_is_rejected_with_its_reason(runs):
    rejected = [json.loads(x) for x in (runs[0] / "rejected.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reason"]) for r in rejected] == [(LONG_TONE, "extractor_failed")]
    assert rejected[0]["detail"].startswith("frame_loudness: ValueError: clip of 6.00 s is longer than 5.0 s")
    stats = json.loads((runs[0] / "stats.json").read_text())
    assert stats["counts"]["per_reason"]["extractor_failed"] == 1
    assert stats["counts"]["in_shards"] + stats["counts"]["rejected"] == stats["counts"]["input_rows"] == 8


def test_a_cached_rerun_stores_the_extractor_outputs_byte_identically(runs):
    first, again = _records(runs[0]), _records(runs[1])
    stats = json.loads((runs[1] / "stats.json").read_text())
    assert stats["cache"]["hits"] == 7 and stats["cache"]["computed"] == 0
    assert sorted(first) == sorted(again)
    for key in first:
        for name in ("speaker_embedding", "codes", "codes_len", "loudness", "mel"):
            assert first[key]["raw"][name] == again[key]["raw"][name], (key, name)
    assert read_schema(str(runs[0])).to_dict() == read_schema(str(runs[1])).to_dict()


# -- the trainer side: one tiny build on the run's shards ---------------------------------------------


@pytest.fixture(scope="module")
def embedding_model(runs, tmp_path_factory):
    """examples.embedding_tts trained 4 steps (loop.jit_compile false) on the run's shards."""
    from melshards.commands.train import run
    from tests.train.conftest import TEST_CONFIG

    tmp = tmp_path_factory.mktemp("embedding_tts")
    cfg = {k: dict(v) for k, v in TEST_CONFIG.items()}
    cfg["model"] = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1}
    cfg["data"]["batch_size"] = 2
    cfg["loop"].update(steps=4, checkpoint_every=4, log_every=2, val_every=4, jit_compile=False)
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    args = [str(runs[0] / "train-*.tfrecord"), "--model-dir", str(tmp / "model"), "--config", str(tmp / "c.yaml")]
    assert run([*args, "--model", "examples.embedding_tts:build"]) == 0
    return tmp / "model"


def test_a_model_declaring_the_embedding_reads_it_with_its_static_shape(runs):
    import melshards
    from melshards.train.plugins import model_inputs

    assert model_inputs("examples.embedding_tts:build")[-1] == "speaker_embedding"
    ds = melshards.dataset(str(runs[0] / "train-*.tfrecord"), batch_size=2, features=("speaker_embedding", "codes"))
    assert ds.element_spec["speaker_embedding"].shape == (2, 4)
    assert ds.element_spec["codes"].shape == (2, read_schema(str(runs[0])).largest.feature("codes").shape[0])


def test_the_embedding_model_trains_and_speaks_with_the_speakers_stored_centroid(runs, embedding_model):
    """What `melshards synthesize TEXT --speaker NAME` runs (`Synthesizer.speak`): the model gathers the
    speaker's centroid from schema.json, so two speakers give two different mels."""
    from examples.embedding_tts import build
    from melshards.train.synthesize import load_synthesizer, padded_text_ids, pick_language, pick_speaker

    summary = json.loads((embedding_model / "run_summary.json").read_text())
    assert summary["steps_run"] == 4 and np.isfinite(summary["final_losses"]["train"]["loss"])
    schema = read_schema(str(runs[0]))
    model = build(schema, {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1})
    assert model.centroids.numpy().tolist() == np.asarray(schema.centroids("speaker_embedding"), np.float32).tolist()
    synth = load_synthesizer(str(embedding_model))
    ids, n = padded_text_ids("hello there.", schema)
    lang = pick_language(schema, None)
    mels = [synth.speak(ids, n, pick_speaker(schema, name), lang)["mel"].numpy() for name in ("anna", "bert")]
    assert all(np.isfinite(m).all() for m in mels) and not np.array_equal(mels[0], mels[1])


def test_the_example_builder_refuses_to_write_over_a_file_it_did_not_make(tmp_path):
    import subprocess
    import sys

    mine = tmp_path / "embedding.onnx"
    mine.write_bytes(b"the user's own model")
    done = subprocess.run(
        [sys.executable, "-m", "examples.extractors", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 1 and f"{mine} exists" in done.stderr, done.stderr[-500:]
    assert mine.read_bytes() == b"the user's own model" and not (tmp_path / "codec").exists()
