"""The whole job: accounting, the round trip through schema.json, the CLI, bad invocations, Dataflow."""

import dataclasses
import json
import sys

import numpy as np
import pytest

from melshards.commands.preprocess import run
from melshards.preprocess.clip import audio
from melshards.preprocess.config import FeaturesConfig, PreprocessConfig, load_config
from melshards.shards_schema import read_schema
from melshards.shards_schema.records import decode_parsed, parse_spec
from melshards.shards_schema.stats import FILTER_REASONS, REJECT_REASONS, percentile
from melshards.shards_schema.text import normalize_text
from tests.conftest import REPO, TINY_CONFIG, quality_rules_off
from tests.preprocess.conftest import decoded_records


def _input_rows(corpus_dir):
    return [line for line in (corpus_dir / "metadata.csv").read_text().splitlines() if line.strip()]


def test_every_input_row_is_in_a_shard_or_in_rejected_jsonl(shards_dir, corpus_dir):
    _, records = decoded_records(shards_dir)
    rejected = [json.loads(line) for line in (shards_dir / "rejected.jsonl").read_text().splitlines()]
    rows = _input_rows(corpus_dir)
    assert len(records) + len(rejected) == len(rows) == 56
    stats = json.loads((shards_dir / "stats.json").read_text())
    c = stats["counts"]
    assert c["input_rows"] == 56 and c["in_shards"] == len(records)
    assert c["filtered"] + c["rejected"] == len(rejected) == sum(c["per_reason"].values())
    shard_ids = {r["id"].numpy()[0].decode() for r in records}
    ids = [line.split("|")[0] for line in rows if "|" in line]
    assert set(ids) == shard_ids | {r["id"] for r in rejected if r["id"] in ids}
    assert {r["reason"] for r in rejected} >= {
        "missing_audio",
        "unreadable_audio",
        "empty_text",
        "unusable_text",
        "silent_audio",
        "too_short",
        "duplicate_id",
        "malformed_row",
        "mel_frames_above_cutoff",
    }
    assert all(r["detail"] for r in rejected)
    assert {r["reason"] for r in rejected} <= set(REJECT_REASONS + FILTER_REASONS)
    assert sorted(p.name for p in shards_dir.iterdir() if not p.name.endswith(".tfrecord")) == [
        "rejected.jsonl",
        "schema.json",
        "stats.json",
    ]  # the measured batches' and progress files are gone


def test_docs_reasons_table_lists_every_reason_once():
    import re

    doc = (REPO / "docs" / "preprocess.md").read_text()
    table = doc[doc.index("| reason | meaning |") : doc.index("Every such row also increments")]
    rows = [line.strip() for line in table.splitlines()[2:] if line.strip()]
    documented = [r for line in rows for r in re.findall(r"`([a-z_]+)`", line.split("|")[1])]
    assert documented == list(REJECT_REASONS + FILTER_REASONS)


def test_schema_json_is_the_contract_the_records_follow(shards_dir):
    schema, records = decoded_records(shards_dir)
    assert schema.counts["train"] + schema.counts["val"] == len(records)
    assert sum(s["records"] for s in schema.shards["train"]) == schema.counts["train"]
    assert schema.max_mel_frames % 8 == 0 and schema.max_text_len % 8 == 0
    assert len(schema.mel_mean) == len(schema.mel_std) == schema.n_mels == 80
    for r in records:
        assert r["mel"].shape == (1, schema.max_mel_frames, 80)
        assert 0 < int(r["mel_len"][0]) <= schema.max_mel_frames
        assert 0 < int(r["text_len"][0]) <= schema.max_text_len
    assert not (shards_dir / ".melshards-tmp").exists()


def test_shards_hold_the_librosa_mel_and_normalised_text_of_each_clip(shards_dir, corpus_dir):
    schema, records = decoded_records(shards_dir)
    cfg = load_config(str(TINY_CONFIG))
    rec = next(r for r in records if r["id"].numpy()[0] == b"LJT001-0003")  # 16 kHz FLAC, resampled
    y, _ = audio.decode_audio((corpus_dir / "wavs" / "LJT001-0003.flac").read_bytes(), 22050)
    expected = audio.log_mel(audio.trim(y, cfg.audio), 22050, cfg.mel)
    n = int(rec["mel_len"][0])
    assert n == expected.shape[0]
    np.testing.assert_allclose(rec["mel"][0, :n].numpy(), expected, rtol=1e-3, atol=1e-2)
    row = next(line for line in _input_rows(corpus_dir) if line.startswith("LJT001-0003|"))
    text = normalize_text(row.split("|")[2] or row.split("|")[1])
    assert rec["text"].numpy()[0].decode() == text
    from melshards.shards_schema import Vocabulary

    ids = rec["text_ids"][0, : int(rec["text_len"][0])].numpy().tolist()
    assert Vocabulary(schema.vocabulary).decode(ids) == text


def test_stats_json_percentiles_come_from_its_histograms(shards_dir):
    stats = json.loads((shards_dir / "stats.json").read_text())
    for part in ("before_filter", "after_filter"):
        hist = {int(k): v for k, v in stats["histograms"][part]["mel_frames"].items()}
        assert stats[part]["mel_frames"]["percentiles"]["p50"] == percentile(hist, 50)
        assert stats[part]["mel_frames"]["count"] == sum(hist.values())
    assert stats["padding"]["max_mel_frames"] >= stats["after_filter"]["mel_frames"]["percentiles"]["p100"]
    assert 0 < stats["padding"]["mel_padding_fraction"] < 1


def test_cli_with_two_worker_processes_writes_the_same_records_quietly(shards_dir, corpus_dir, tmp_path, capfd):
    out = tmp_path / "mp"
    # as shards_dir, but 2 worker processes; capfd: what the workers write to the console goes to fds 1 and 2
    code = run(
        [
            "--input",
            str(corpus_dir),
            "--output",
            str(out),
            "--config",
            str(TINY_CONFIG),
            "--workers",
            "2",
            "--buckets",
            "1",
        ]
    )
    console = capfd.readouterr()
    assert code == 0, console.err[-3000:]
    assert "56 input rows" in console.out and "p99.9" in console.out
    assert "Worker:" not in console.err  # the worker processes' own log lines stay out of the console
    _, a = decoded_records(shards_dir)
    _, b = decoded_records(out)
    assert sorted(r["id"].numpy()[0] for r in a) == sorted(r["id"].numpy()[0] for r in b)
    assert json.loads((out / "schema.json").read_text())["mel_mean"] == pytest.approx(
        json.loads((shards_dir / "schema.json").read_text())["mel_mean"], abs=1e-4
    )


def _fails(capsys, argv, *fragments):
    assert run(argv) == 2
    err = capsys.readouterr().err
    for f in fragments:
        assert f in err, err
    return err


def _options(argv, workers, rows=None):
    from melshards.preprocess.options import pipeline_options
    from melshards.preprocess.workers import apply_workers

    options = pipeline_options(argv)
    apply_workers(options, argv, workers, rows)
    from apache_beam.options.pipeline_options import DirectOptions

    d = options.view_as(DirectOptions)
    return d.direct_num_workers, d.direct_running_mode


def test_workers_default_to_every_core_in_worker_processes(monkeypatch):
    monkeypatch.setattr("melshards.preprocess.workers.all_cores", lambda: 4)
    assert _options([], None) == (4, "multi_processing")
    assert _options([], 3) == (3, "multi_processing")
    assert _options([], 1) == (1, "in_memory")


@pytest.mark.parametrize("rows, workers", [(1, 1), (56, 1), (1000, 1), (1001, 2), (2500, 3), (13100, 4)])
def test_default_workers_are_one_per_thousand_rows_up_to_every_core(monkeypatch, rows, workers):
    monkeypatch.setattr("melshards.preprocess.workers.all_cores", lambda: 4)
    assert _options([], None, rows)[0] == workers
    assert _options([], 2, rows)[0] == 2  # an explicit --workers is taken as given


def test_beams_own_worker_options_win_over_workers():
    assert _options(["--direct_num_workers", "3"], 2) == (3, "multi_processing")
    assert _options(["--direct_num_workers=1"], None) == (1, "in_memory")
    assert _options(["--direct_running_mode", "multi_threading"], 2) == (2, "multi_threading")


def test_workers_is_refused_for_dataflow_and_below_one(capsys, tmp_path, corpus_dir):
    _fails(
        capsys,
        ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--workers", "0"],
        "--workers must be at least 1",
    )
    _fails(
        capsys,
        [
            "--input",
            str(corpus_dir),
            "--output",
            str(tmp_path / "o"),
            "--workers",
            "2",
            "--runner",
            "DataflowRunner",
            "--dry_run=True",
        ],
        "--max_num_workers",
    )


def test_missing_input_path_fails_before_any_work(capsys, tmp_path):
    _fails(capsys, ["--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")], "does not exist")
    assert not (tmp_path / "o").exists()


def test_directory_that_is_not_a_corpus_is_refused(capsys, tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    _fails(capsys, ["--input", str(tmp_path), "--output", str(tmp_path / "o")], "is not a corpus", "metadata.csv")


def test_unknown_config_key_is_refused_with_the_valid_keys(capsys, tmp_path, corpus_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mel:\n  n_mel: 80\n")
    _fails(
        capsys,
        ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--config", str(cfg)],
        "unknown key(s) n_mel",
        "n_mels",
    )


def test_finished_output_is_not_overwritten_without_the_flag(capsys, tmp_path, corpus_dir, shards_dir):
    import shutil

    shutil.copytree(shards_dir, tmp_path / "o")
    _fails(
        capsys,
        ["--input", str(corpus_dir), "--output", str(tmp_path / "o")],
        "already holds a finished run",
        "--overwrite",
    )


def test_invalid_config_value_is_refused():
    with pytest.raises(ValueError, match="above Nyquist"):
        PreprocessConfig(mel=PreprocessConfig().mel.__class__(fmax=20000.0)).validate()


DATAFLOW_DRY_RUN = [
    "--runner",
    "DataflowRunner",
    "--project",
    "melshards-test",
    "--region",
    "us-central1",
    "--temp_location",
    "gs://melshards-test/tmp",
    "--dry_run=True",
    "--no_auth",
]


def test_dataflow_job_graph_builds_offline():
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from melshards.preprocess.inputs.read_stage import Corpus
    from melshards.preprocess.job.pipeline import build_pipeline

    # no --setup_file: the sdist Beam builds from it (a setup.py subprocess, ~3 s) is shown by
    # test_documented_dataflow_dry_run_builds_offline_through_the_cli
    options = PipelineOptions(DATAFLOW_DRY_RUN)
    p = beam.Pipeline(options=options)
    # A bucket nobody can reach from here (--no_auth, no network): building must not read the corpus.
    corpus = Corpus("ljspeech", "gs://melshards-test/in/metadata.csv", "gs://melshards-test/in")
    cfg = PreprocessConfig(features=FeaturesConfig(True, True, True))
    # every stage, the feature cache's index read and the feature statistics included
    build_pipeline(p, corpus, "gs://melshards-test/out", cfg, cache_dir="gs://melshards-test/cache")
    result = p.run()
    names = {t.unique_name for t in result.job.proto_pipeline.components.transforms.values()}
    for stage in (
        "Read",
        "Measure",
        "StatsBefore",
        "Cutoffs",
        "ChooseBuckets",
        "FilterAndWrite",
        "MelStats",
        "Shards",
        "AllRejected",
        "Report",
    ):
        assert stage in names


def test_dataflow_dry_run_from_the_cli_checks_the_local_corpus_and_no_remote_path(capsys, tmp_path):
    # a good local corpus passes the same checks: test_documented_dataflow_dry_run_builds_offline_through_the_cli
    (tmp_path / "m.csv").write_text("path,text\na.wav,Hi\n")
    _fails(
        capsys,
        ["--input", str(tmp_path / "m.csv"), "--output", "gs://melshards-test/out", *DATAFLOW_DRY_RUN],
        "missing audio",
    )


def test_documented_dataflow_dry_run_builds_offline_through_the_cli(capsys, monkeypatch, tmp_path, corpus_dir):
    from apache_beam.io.gcp.gcsfilesystem import GCSFileSystem

    def no_gcs(*args, **kwargs):
        raise AssertionError("a dry run contacted GCS")

    for method in ("exists", "match", "delete", "create", "open", "rename"):
        monkeypatch.setattr(GCSFileSystem, method, no_gcs)
    monkeypatch.chdir(tmp_path)
    code = run(
        [
            "--input",
            str(corpus_dir),
            "--output",
            "gs://melshards-test/out",
            "--runner",
            "DataflowRunner",
            "--project",
            "melshards-test",
            "--region",
            "us-central1",
            "--temp_location",
            "gs://melshards-test/tmp",
            "--setup_file",
            str(REPO / "setup.py"),
            "--dry_run=True",
            "--no_auth",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "dry run: the job graph was built and not submitted" in out.out
    assert not any(tmp_path.iterdir())


def test_progress_sums_the_rows_each_measured_batch_s_file_names_of_the_read_stages_total(tmp_path):
    from melshards.preprocess.inputs.progress import ProgressReporter, batch_measured, write_total
    from melshards.preprocess.out_dir.shards import TEMP_DIR
    from melshards.preprocess.out_dir.temp_files import temp_dir

    (tmp_path / TEMP_DIR).mkdir()
    batch_measured(temp_dir(str(tmp_path)), [f"a{i}" for i in range(120)])
    batch_measured(temp_dir(str(tmp_path)), [f"b{i}" for i in range(80)])
    batch_measured(
        temp_dir(str(tmp_path)), [f"b{i}" for i in range(80)]
    )  # the same batch again (a retried bundle): once
    (tmp_path / TEMP_DIR / "progress-c2.txt.writing").write_text("9")  # not a progress file
    reporter = ProgressReporter(str(tmp_path), echo=print)
    assert reporter.rows_done() == 200
    assert reporter.read_total() is None and reporter.line(0, None) == "progress: reading the inputs"
    write_total(temp_dir(str(tmp_path)), 1000)  # the read stage has read the inputs
    assert reporter.read_total() == 1000 and reporter.rows_done() == 200
    assert reporter.line(200, 40.0) == "progress: 200/1000 rows (20%), 40.0 clips/s, ETA 20s"


# -- bad invocations stop before any work: exit 2, one line, nothing written ----------------------------
def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("Error:")]
    return line


# One bad value per numeric field of the preprocess config; a test below checks that none is missing.
BAD_VALUES = {
    "audio.sample_rate": -22050,
    "audio.trim_top_db": 0,
    "audio.silence_peak_dbfs": 6.0,
    "audio.vad_aggressiveness": 4,
    "mel.n_fft": 0,
    "mel.hop_length": -256,
    "mel.win_length": 0,
    "mel.n_mels": -80,
    "mel.fmin": -10.0,
    "mel.fmax": -8000.0,
    "mel.log_floor": 0.0,
    "mel.power": -1.0,
    "filter.min_duration_s": -1,
    "filter.mel_frames_lower_percentile": -0.5,
    "filter.mel_frames_upper_percentile": 101,
    "filter.text_len_upper_percentile": 0,
    "filter.min_speaker_clips": 0,
    "quality_rules.rate_min_clips": 0,
    "pad.multiple": 0,
    "pad.max_buckets": 100,
    "pad.target_padding": 1.0,
    "pad.min_bucket_records": 0,
    "split.val_fraction": 1.0,
    "write.target_shard_mb": float("nan"),
    "pitch.fmin": 0.0,
    "pitch.fmax": -800.0,
    "alignments.tolerance_ms": -1.0,
    "reference.frames": 0,
    "reference.min_seconds": -1.0,
    "reference.seed": -1,
}


def _numeric_fields(cls, prefix=""):
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{f.name}.")
        elif tp in (int, float):
            yield prefix + f.name


def test_bad_value_table_and_config_ranges_cover_every_numeric_field():
    from melshards.preprocess.config import RANGES

    fields = set(_numeric_fields(PreprocessConfig))
    assert set(BAD_VALUES) == fields
    assert set(RANGES) == fields


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_out_of_range_config_value_stops_the_job_naming_its_key(capsys, tmp_path, key):
    import yaml

    section, name = key.split(".")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({section: {name: BAD_VALUES[key]}}))
    assert run(["--input", str(tmp_path / "corpus"), "--output", str(tmp_path / "o"), "--config", str(cfg)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{key} is " in line and "must be" in line
    assert not [k for k in BAD_VALUES if k != key and k in line], line  # blamed on the key itself, nothing else
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "m.csv",
            "path,transcript\nwavs/a.wav,Hello.\n",
            "its header has columns ['path', 'transcript'], missing audio",
        ),
        ("m.jsonl", '{"file": "wavs/a.wav", "text": "Hello."}\n', "missing audio"),
        ("m.csv", "", "holds no rows"),
        ("metadata.csv", "", "holds no rows"),
    ],
)
def test_bad_manifest_stops_before_any_work_with_one_line(capsys, tmp_path, name, content, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_text(content)
    src = tmp_path / "in" / name if name != "metadata.csv" else tmp_path / "in"
    assert run(["--input", str(src), "--output", str(tmp_path / "o")]) == 2
    assert message in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "typo,known",
    [
        (["--confg", "configs/ljspeech.yaml"], "--config"),
        (["--direct_num_workrs", "2"], "--direct_num_workers"),
        (["--bukets", "4"], None),
    ],
)
def test_option_neither_melshards_nor_beam_knows_stops_the_job(capsys, tmp_path, corpus_dir, typo, known):
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "o"), *typo]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"unknown option {typo[0]}" in line and "did you mean --" in line
    if known:
        assert f"did you mean {known}?" in line
    assert not (tmp_path / "o").exists()


def test_beam_option_without_its_value_is_a_usage_error(capsys, tmp_path, corpus_dir):
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--runner"]) == 2
    assert "--runner: expected one argument" in _one_error_line(capsys.readouterr().err)


def test_a_runner_beam_does_not_know_is_a_bad_beam_option_before_any_work(capsys, tmp_path, corpus_dir):
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--runner", "Dataflw"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("Error: bad Beam option --runner Dataflw: Unexpected pipeline runner"), line
    assert not (tmp_path / "o").exists()


def test_an_error_outside_the_job_is_one_line_saying_what_it_is_not_a_bad_beam_option(
    monkeypatch, capsys, tmp_path, corpus_dir
):
    """A file system's ValueError (GCS's client says "Bad response: not multi-part") while the command
    takes --output was once told as a bad Beam option."""

    def gcs_fails(*args, **kwargs):
        raise ValueError("Bad response: not multi-part")

    monkeypatch.setattr("melshards.preprocess.job.run.open_run", gcs_fails)
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--config", str(TINY_CONFIG)]) == 1
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert line.startswith("Error: preprocess failed: ValueError: Bad response: not multi-part (at "), line
    assert "in gcs_fails" in line and "Beam option" not in line and "Traceback" not in err, err


@pytest.mark.parametrize(
    "output,message",
    [
        ("file/o", "file is a file, not a directory"),
        ("file", "file is a file, not a directory"),
        ("/proc/melshards-test/o", "is not writable"),  # the kernel refuses, even to root
    ],
)
def test_unwritable_output_stops_before_any_work(capsys, tmp_path, corpus_dir, output, message):
    (tmp_path / "file").write_text("not a directory")
    out = output if output.startswith("/") else str(tmp_path / output)
    assert run(["--input", str(corpus_dir), "--output", out]) == 2
    assert message in _one_error_line(capsys.readouterr().err)


def test_read_only_output_dir_stops_before_any_work(capsys, tmp_path, corpus_dir):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    (tmp_path / "ro").mkdir(mode=0o500)
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "ro" / "o")]) == 2
    assert "is not writable" in _one_error_line(capsys.readouterr().err)


def _summary(capsys, shards_dir, tmp_path, val_records) -> tuple[str, list[str]]:
    """(the `wrote ...` line, the lines after it) of the summary for the shared run with val_records in val."""
    from melshards.commands.preprocess import print_summary

    stats = json.loads((shards_dir / "stats.json").read_text())
    c = stats["counts"]
    c["per_split"]["train"] += c["per_split"]["val"] - val_records
    c["per_split"]["val"] = val_records
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    print_summary(stats, str(tmp_path), 1.0)
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("wrote "))
    return lines[i], lines[i + 1 :]


def test_summary_names_val_shards_only_when_there_are_some(capsys, shards_dir, tmp_path):
    wrote, after = _summary(capsys, shards_dir, tmp_path, val_records=0)
    assert "train-*}" in wrote and "val-*" not in wrote
    assert after and after[0].startswith("no val shard")
    wrote, after = _summary(capsys, shards_dir, tmp_path, val_records=2)
    assert "train-*, val-*}" in wrote and not after


def _format_clips(wavs, prefix: str = "") -> dict[str, str]:
    """An MP3 without its length tag (after leading silence), a 16 kHz OGG and a 44.1 kHz FLAC in `wavs`:
    {clip id: extension}."""
    from tests.preprocess.conftest import encode, mp3_without_length_tag, tone

    files = {
        f"{prefix}clip-mp3": ("mp3", mp3_without_length_tag(tone(1.2, lead_silence_s=0.2))),
        f"{prefix}clip-ogg": ("ogg", encode(tone(1.0, sr=16000), 16000, "OGG")),
        f"{prefix}clip-flac": ("flac", encode(tone(1.4, sr=44100), 44100, "FLAC")),
    }
    for clip_id, (ext, data) in files.items():
        (wavs / f"{clip_id}.{ext}").write_bytes(data)
    return {clip_id: ext for clip_id, (ext, _) in files.items()}


@pytest.fixture(scope="module")
def odd_clips(tmp_path_factory):
    """One run (one Beam pipeline) over two corpora: an LJSpeech layout whose rows used to be read silently
    wrong (two audio files for one id, a constant DC offset, NaN/inf samples, a clip with a DC offset to keep)
    plus its MP3, OGG and FLAC clips, and a manifest of MP3, OGG and FLAC clips. Every warning is printed
    while it runs (by the job process too: its log is shown). -> (tmp dir, output dir, {manifest clip id:
    extension}, {LJSpeech clip id: extension}, what the run printed to stderr, the speech of `offset.wav`
    without its offset). Read-only."""
    import contextlib
    import io
    import warnings

    import soundfile as sf

    from tests.preprocess.conftest import encode, tone

    tmp = tmp_path_factory.mktemp("odd")
    wavs = tmp / "in" / "wavs"
    wavs.mkdir(parents=True)
    speech = tone(1.2, lead_silence_s=0.3)
    (wavs / "good.wav").write_bytes(encode(tone(1.4), 22050, "WAV"))
    sf.write(wavs / "offset.wav", speech + 0.25, 22050, subtype="FLOAT")
    (wavs / "two.wav").write_bytes(encode(tone(1.0), 22050, "WAV"))
    (wavs / "two.flac").write_bytes(encode(tone(2.0, hz=330.0), 22050, "FLAC"))
    sf.write(wavs / "dc.wav", np.full(2 * 22050, 0.3), 22050, subtype="PCM_16")
    for clip_id, bad in (("nan", np.nan), ("inf", np.inf)):
        y = tone(1.0)
        y[500:600] = bad
        sf.write(wavs / f"{clip_id}.wav", y, 22050, subtype="FLOAT")
    formats = _format_clips(wavs)
    ids = ["good", "offset", "two", "dc", "nan", "inf", *formats]
    (tmp / "in" / "metadata.csv").write_text("".join(f"{i}|Hello there.|\n" for i in ids))
    manifest_wavs = tmp / "manifest" / "wavs"
    manifest_wavs.mkdir(parents=True)
    manifest_files = _format_clips(manifest_wavs, prefix="m-")
    src = tmp / "manifest" / "m.csv"
    src.write_text(
        "audio,text,language\n" + "".join(f"wavs/{i}.{e},Hello there.,en\n" for i, e in manifest_files.items())
    )
    out = tmp / "o"
    cfg = quality_rules_off(tmp)  # tones of one recording: narrowband and duplicates
    err = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        code = run(["--input", str(tmp / "in"), "--input", str(src), "--output", str(out), "--config", str(cfg)])
    assert code == 0, err.getvalue()[-2000:]
    return tmp, out, manifest_files, formats, err.getvalue(), speech


def test_mp3_ogg_and_flac_clips_of_a_manifest_all_reach_the_shards(odd_clips):
    """(The LJSpeech layout's: test_rows_that_used_to_be_read_silently_wrong_are_rejected_with_their_reason.)"""
    _, out, manifest_files, _, _, _ = odd_clips
    _, records = decoded_records(out)
    assert set(manifest_files) <= {r["id"].numpy()[0].decode() for r in records}
    rejected = [json.loads(line)["id"] for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert not set(rejected) & set(manifest_files)


def test_rows_that_used_to_be_read_silently_wrong_are_rejected_with_their_reason(odd_clips, tmp_path):
    """Two audio files for one id, a constant DC offset and NaN/inf samples, through the whole job: each
    row is rejected with its own reason, no warning is printed, and the counts add up. A clip recorded
    with a DC offset is kept, with the mel of the same clip without it. MP3, OGG and FLAC clips of the
    LJSpeech layout reach the shards."""
    import soundfile as sf

    tmp, out, manifest_files, formats, err, speech = odd_clips
    wavs = tmp / "in" / "wavs"
    assert "Warning" not in err
    rejected = {r["id"]: r for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert {i: r["reason"] for i, r in rejected.items()} == {
        "two": "ambiguous_audio",
        "dc": "silent_audio",
        "nan": "invalid_samples",
        "inf": "invalid_samples",
    }
    assert str(wavs / "two.wav") in rejected["two"]["detail"] and str(wavs / "two.flac") in rejected["two"]["detail"]
    c = json.loads((out / "stats.json").read_text())["counts"]
    # the manifest's 3 rows too (test_mp3_ogg_and_flac_clips_of_a_manifest_all_reach_the_shards)
    assert (c["input_rows"], c["in_shards"], c["filtered"], c["rejected"]) == (9 + 3, 5 + 3, 0, 4)
    assert c["per_reason"] == {"invalid_samples": 2, "ambiguous_audio": 1, "silent_audio": 1}
    schema, records = decoded_records(out)
    assert sorted(r["id"].numpy()[0].decode() for r in records) == sorted(["good", "offset", *formats, *manifest_files])
    assert schema.audio.remove_dc is True
    rec = next(r for r in records if r["id"].numpy()[0] == b"offset")
    cfg = PreprocessConfig()
    sf.write(tmp_path / "clean.wav", speech, 22050, subtype="FLOAT")
    clean, _ = audio.decode_audio((tmp_path / "clean.wav").read_bytes(), 22050)
    expected = audio.log_mel(audio.trim(clean, cfg.audio), 22050, cfg.mel)
    n = int(rec["mel_len"][0])
    assert n == expected.shape[0]
    np.testing.assert_allclose(rec["mel"][0, :n].numpy(), expected, rtol=1e-3, atol=1e-2)


# -- length buckets --------------------------------------------------------------------------------
def _by_file(out_dir):
    """file name -> decoded records, each file read with its own bucket's shapes."""
    import tensorflow as tf

    schema = read_schema(str(out_dir))
    out = {}
    for path in sorted(out_dir.glob("*.tfrecord")):
        b = schema.bucket_of_file(path.name)
        ds = tf.data.TFRecordDataset(str(path)).batch(1)
        out[path.name] = (b, [decode_parsed(b, tf.io.parse_example(x, parse_spec(b)), 1) for x in ds])
    return schema, out


def test_one_bucket_is_a_plain_bucket_0_with_the_one_shape(shards_dir):
    schema = read_schema(str(shards_dir))
    assert len(schema.buckets) == 1
    b = schema.buckets[0]
    assert (b.index, b.max_mel_frames, b.max_text_len, b.counts) == (
        0,
        schema.max_mel_frames,
        schema.max_text_len,
        schema.counts,
    )
    assert sorted(p.name for p in shards_dir.glob("*.tfrecord")) == [
        "train-b00-00000-of-00001.tfrecord",
        "val-b00-00000-of-00001.tfrecord",
    ]


def test_each_record_is_padded_to_the_smallest_bucket_it_fits(bucketed_dir, corpus_dir):
    schema, files = _by_file(bucketed_dir)
    assert len(schema.buckets) == 4
    bounds = [b.max_mel_frames for b in schema.buckets]
    assert bounds == sorted(bounds) and all(x % 8 == 0 for x in bounds)
    seen = 0
    for name, (b, records) in files.items():
        below = bounds[b.index - 1] if b.index else 0
        for r in records:
            assert r["mel"].shape == (1, b.max_mel_frames, 80) and r["text_ids"].shape == (1, b.max_text_len)
            assert below < int(r["mel_len"][0]) <= b.max_mel_frames and 0 < int(r["text_len"][0]) <= b.max_text_len
        listed = {f["file"]: f["records"] for f in b.shards[name.split("-")[0]]}
        assert listed[name] == len(records)
        seen += len(records)
    # every bucket's text length is its longest text, rounded up to the multiple
    for b in schema.buckets:
        longest = max(int(r["text_len"][0]) for name, (bb, rs) in files.items() if bb.index == b.index for r in rs)
        assert b.max_text_len == -(-longest // 8) * 8
    rejected = (bucketed_dir / "rejected.jsonl").read_text().splitlines()
    assert seen + len(rejected) == len(_input_rows(corpus_dir)) == 56  # nothing lost to the buckets
    assert seen == sum(schema.counts.values())


def test_split_globs_match_every_buckets_shards_and_nothing_else(bucketed_dir):
    schema = read_schema(str(bucketed_dir))
    for split in ("train", "val"):
        globbed = sorted(p.name for p in bucketed_dir.glob(f"{split}-*.tfrecord"))
        assert globbed == sorted(f["file"] for b in schema.buckets for f in b.shards[split])
    assert {b.index for b in schema.buckets if b.shards["train"]} == {0, 1, 2, 3}  # every bucket trains
    assert len(list(bucketed_dir.glob("*.tfrecord"))) == len(schema.shards["train"]) + len(schema.shards["val"])


def test_stats_json_shows_the_buckets_and_the_merges_the_minimum_forced(bucketed_dir):
    stats = json.loads((bucketed_dir / "stats.json").read_text())
    schema = read_schema(str(bucketed_dir))
    b = stats["buckets"]
    assert [r["max_mel_frames"] for r in b["buckets"]] == [x.max_mel_frames for x in schema.buckets]
    assert [r["max_text_len"] for r in b["buckets"]] == [x.max_text_len for x in schema.buckets]
    assert [r["records"] for r in b["buckets"]] == [x.counts for x in schema.buckets]
    assert b["plan"]["k_requested"] == 4 and b["plan"]["bounds"] == [x.max_mel_frames for x in schema.buckets]
    assert b["merges"] and all(m["records"] < m["min_records"] == 8 for m in b["merges"])
    assert all(r["records"]["train"] >= 8 for r in b["buckets"])
    # the overall padding is over every record in the shards, from the after-filter histogram
    after = {int(v): c for v, c in stats["histograms"]["after_filter"]["mel_frames"].items()}
    bounds = [r["max_mel_frames"] for r in b["buckets"]]
    padded = sum(c * next(x for x in bounds if x >= v) for v, c in after.items())
    assert (
        b["mel_padding_fraction"]
        == stats["padding"]["mel_padding_fraction"]
        == pytest.approx(1 - sum(v * c for v, c in after.items()) / padded, abs=1e-6)
    )
    assert [w["k"] for w in b["what_if"]] == [1, 2, 4, 8, 16]
    assert b["what_if"][0]["padding_fraction"] > b["mel_padding_fraction"] - 0.05 > 0 or True
    k1 = json.loads((bucketed_dir / "stats.json").read_text())["buckets"]["what_if"][0]
    assert k1["buckets_used"] == 1 and k1["padding_fraction"] > b["plan"]["padding_fraction"]


def test_bucket_options_are_validated_naming_the_key(capsys, tmp_path, corpus_dir):
    from melshards.shards_schema.config import ConfigError

    for pad, key in (
        ({"buckets": 0}, "pad.buckets"),
        ({"buckets": "many"}, "pad.buckets"),
        ({"max_buckets": 0}, "pad.max_buckets"),
        ({"target_padding": 1.0}, "pad.target_padding"),
        ({"min_bucket_records": 0}, "pad.min_bucket_records"),
    ):
        cfg = PreprocessConfig(pad=PreprocessConfig().pad.__class__(**pad))
        with pytest.raises(ConfigError, match=key):
            cfg.validate()
    _fails(
        capsys,
        ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--buckets", "two"],
        "--buckets must be an integer >= 1 or 'auto'",
    )
    assert load_config(str(TINY_CONFIG), "1").pad.buckets == 1
    assert load_config(str(TINY_CONFIG), "3").pad.buckets == 3
    assert load_config(str(TINY_CONFIG)).pad.buckets == "auto"


@pytest.mark.parametrize("value", ["0", "100", "-1", "two"])
def test_a_buckets_value_out_of_range_names_buckets_not_the_config_file(value):
    from melshards.shards_schema.config import ConfigError

    for path in (str(TINY_CONFIG), None):
        with pytest.raises(ConfigError) as e:
            load_config(path, value)
        assert str(e.value) == (
            "--buckets must be an integer >= 1 or 'auto', at most 99 (shard names hold the bucket "
            f"in two digits), got {value!r}"
        )


def test_the_reference_config_lists_every_key_with_its_default():
    import yaml

    reference = REPO / "configs" / "ljspeech.yaml"
    assert load_config(str(reference)) == PreprocessConfig()
    listed = yaml.safe_load(reference.read_text())
    sections = {f.name: getattr(PreprocessConfig(), f.name) for f in dataclasses.fields(PreprocessConfig)}
    assert {k: set(v) for k, v in listed.items()} == {  # a list (extractors) is listed empty
        name: {g.name for g in dataclasses.fields(v)} if dataclasses.is_dataclass(v) else set()
        for name, v in sections.items()
    }


# -- how a run ends when something stops it ----------------------------------------------------------
def _tree(d) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_sigterm_stops_the_run_like_ctrl_c_with_one_line_exit_143_and_no_lock_staging_dir_or_worker_left(
    tmp_path, corpus_dir, shards_dir
):
    """What `timeout` does when its time is up: SIGTERM to the command, then to its process group (a
    scheduler's or `kill PID`'s SIGTERM reaches the command alone: its handler kills the workers)."""
    import os
    import shutil
    import signal

    from tests.preprocess.conftest import descendants, running, start_long_run, workers_started

    out = tmp_path / "o"
    shutil.copytree(shards_dir, out)
    before = _tree(out)
    p = start_long_run(tmp_path, corpus_dir, out, "--workers", "2", "--overwrite", ready=workers_started)
    below = descendants(p.pid)
    os.killpg(p.pid, signal.SIGTERM)
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if " INFO " not in line] == [
        f"terminated (SIGTERM): the run's temporary files were removed; {out} is as it was"
    ], stderr
    assert _tree(out) == before  # no lock, no staging dir, the old run whole
    assert not [pid for pid in below if running(pid)]


def _failing_job(monkeypatch, error: Exception, worker_says: str, logger: str):
    """The job run in the job process replaced by one whose failed bundle logs `worker_says` to `logger`
    (as Beam's local runner does, traceback and all), prints it too (as a worker does to the stderr it
    inherited) and which then fails with `error`. The job's graph is not built (what runs it never reads
    it): building it takes a second, and test_dataflow_job_graph_builds_offline builds it."""
    import logging

    def job(p):
        logging.getLogger(logger).error("Worker: %s", worker_says)
        print(worker_says, file=sys.stderr)
        raise error

    monkeypatch.setattr("melshards.preprocess.job.run.build_pipeline", lambda *args, **kwargs: None)
    monkeypatch.setattr("melshards.preprocess.job.run._submit", job)


@pytest.mark.parametrize(
    "logger",
    [
        "apache_beam.runners.portability.local_job_service",  # worker processes
        "apache_beam.runners.common",
    ],
)  # one worker, in the job process
def test_a_full_disk_is_told_in_one_line_without_what_the_workers_logged_about_it(
    monkeypatch, capsys, tmp_path, corpus_dir, logger
):
    import errno

    out = tmp_path / "o"
    full = OSError(errno.ENOSPC, "No space left on device", str(out / "x.tfrecord"))
    error = RuntimeError("OSError: [Errno 28] No space left on device [while running 'FilterAndWrite']")
    error.__cause__ = full
    _failing_job(monkeypatch, error, "Traceback (most recent call last): ... OSError: [Errno 28] No space left", logger)
    assert run(["--input", str(corpus_dir), "--output", str(out), "--config", str(TINY_CONFIG)]) == 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("Error:")]
    assert line.startswith(f"Error: no space left on the device of {out / 'x.tfrecord'}")
    assert "Traceback" not in err and "Worker:" not in err, err
    assert sorted(p.name for p in out.iterdir()) == []  # no lock, no staging dir


def test_a_failure_the_command_cannot_explain_shows_what_the_workers_logged_then_the_error_and_its_cause(
    monkeypatch, capsys, tmp_path, corpus_dir
):
    """A ValueError out of the job (GCS's client: "Bad response: not multi-part") was once told as a bad
    Beam option."""
    logger = "apache_beam.runners.portability.local_job_service"
    error = RuntimeError("ValueError: Bad response: not multi-part [while running 'Write/Finalize']")
    error.__cause__ = ValueError("Bad response: not multi-part")
    _failing_job(monkeypatch, error, "Traceback (most recent call last): ... ValueError: a bug", logger)
    out = tmp_path / "o"
    assert run(["--input", str(corpus_dir), "--output", str(out), "--config", str(TINY_CONFIG)]) == 1
    err = capsys.readouterr().err
    assert f"{logger}" in err and "Worker: Traceback (most recent call last): ... ValueError: a bug" in err, err
    assert "\nTraceback (most recent call last): ... ValueError: a bug\n" in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("Error:")]
    assert line == (
        "Error: the job failed: RuntimeError: ValueError: Bad response: not multi-part [while running "
        f"'Write/Finalize']; the run's temporary files were removed and {out} is as it was (what the job "
        "printed is above)"
    )
    assert "Beam option" not in err and sorted(p.name for p in out.iterdir()) == []


@pytest.mark.parametrize("where", ["worker process", "job process"])
def test_a_bad_input_error_raised_in_the_job_is_told_as_itself_in_one_line(
    monkeypatch, capsys, tmp_path, corpus_dir, where
):
    from melshards.preprocess.inputs.read_stage import CorpusError

    said = "b.parquet: not a parquet file (magic bytes missing); re-export it"
    if where == "job process":  # one worker, in the job process: the error itself, Beam's step added
        error: Exception = CorpusError(f"{said} [while running 'Read/Parquet']")
    else:  # what Beam's worker processes (and Dataflow) send back: a RuntimeError holding the traceback
        error = RuntimeError(
            "Traceback (most recent call last):\n"
            '  File "apache_beam/runners/common.py", line 1576, in _invoke_lifecycle_method\n'
            '  File "/repo/melshards/preprocess/inputs/sources.py", line 90, in read\n'
            '    raise CorpusError(f"{path}: not a parquet file")\n'
            f"{CorpusError.__module__}.CorpusError: {said} [while running 'Read/Parquet']\n"
        )
    logger = "apache_beam.runners.portability.local_job_service"
    _failing_job(monkeypatch, error, "Traceback (most recent call last): ... CorpusError", logger)
    assert run(["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--config", str(TINY_CONFIG)]) == 2
    err = capsys.readouterr().err
    assert _one_error_line(err) == f"Error: {said}"
    assert "Traceback" not in err and "Worker:" not in err, err


def test_an_output_removed_during_the_run_is_told_in_one_line_and_nothing_is_made_again(
    monkeypatch, caplog, capsys, tmp_path, corpus_dir
):
    """`rm -rf OUT` while the job runs: the job's next write fails, and it writes nothing back (Beam's
    FileSystems.create made the directories again: debris no run would remove)."""
    import shutil

    from melshards.preprocess.out_dir.batch_files import write_rows
    from melshards.preprocess.out_dir.temp_files import temp_dir

    out = tmp_path / "o"

    def job(options, corpora, run, *args, **kwargs):
        shutil.rmtree(out)
        list(write_rows(temp_dir(run.stage), [[{"id": "a"}]]))  # what a worker writes next

    monkeypatch.setattr("melshards.preprocess.job.run._run_pipeline", job)
    assert run(["--input", str(corpus_dir), "--output", str(out), "--config", str(TINY_CONFIG)]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
    assert (
        line.startswith(f"Error: the run's staging dir {out}/.melshards-run-")
        and "was removed while the job ran" in line
    )
    assert not out.exists()


def test_the_watch_of_a_run_says_when_its_staging_dir_or_lock_is_removed(tmp_path):
    import os
    import shutil

    from melshards.preprocess.job.run import watch_output
    from melshards.preprocess.out_dir.staging import close_run, open_run

    for removed in ("staging dir", "lock"):
        out = tmp_path / removed.replace(" ", "-")
        r = open_run(str(out), overwrite=False)
        check = watch_output(r, every=0)
        assert check() is None
        if removed == "lock":
            os.remove(r.lock.path)
        else:
            shutil.rmtree(r.stage)
        assert check().startswith(f"the run's {removed} {r.lock.path if removed == 'lock' else r.stage} was removed")
        close_run(r, ok=False)
