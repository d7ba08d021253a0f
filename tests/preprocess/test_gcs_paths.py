"""Every gs:// path of `melshards preprocess` and `melshards stats` against a real GCS (fake-gcs-server behind
a proxy, tests/gcs_emulator.py): every input kind read from gs://, the feature cache, the TextGrids and an
extractor's model file on gs://, a killed run resumed (and a publish cut short finished), the output lock
and its generation preconditions, `--overwrite`, `cache info` / `prune` and `stats` of a gs:// run. Four
job runs (`--workers 1`) serve them all: the corpora read from local files; the same files on gs://, a
run killed once its first batch is in the cache, the same command again (it resumes), and again with
`--overwrite` (every clip from the cache).

`melshards inspect` and the trainer read gs:// through TensorFlow's own GCS file system, which has no
endpoint override (its API address is built in), so they cannot reach the emulator: docs/testing-gcs.md."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import soundfile as sf
import yaml

from tests.conftest import QUALITY_RULES_OFF, write_textgrid
from tests.gcs_emulator import _bucket as gcs_bucket
from tests.gcs_emulator import download_tree, upload_tree
from tests.preprocess.conftest import descendants, running
from tests.preprocess.test_containers import CLIPS, SR, write_long, write_parquet, write_tar, write_wav_manifest
from tests.preprocess.test_corpora import write_commonvoice, write_libritts, write_vctk

# (input, its path under the corpora's root): every kind of input, each read from gs:// in one run
INPUTS = (
    ("vctk", "vctk"),
    ("libritts", "LibriTTS"),
    ("commonvoice", "cv/cy"),
    ("csv", "csv/clips.csv"),
    ("jsonl", "jsonl/lines.jsonl"),
    ("parquet", "parquet/train.parquet"),
    ("webdataset", "tar"),
    ("segments", "long/segments.csv"),
)
MODEL = "models/embedding.onnx"


def _new_bucket(gcs) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    gcs.make_bucket(name)
    return name


def _config(model_path: str) -> dict:
    """Every clip kept (the same utterances in several forms are duplicates by design, tones are narrowband),
    one bucket, and an ONNX extractor whose model file is `model_path`."""
    return {
        "filter": {
            "min_duration_s": 0.1,
            "mel_frames_lower_percentile": 0.0,
            "mel_frames_upper_percentile": 100.0,
            "text_len_upper_percentile": 100.0,
        },
        "pad": {"buckets": 1},
        "extractors": [
            {
                "factory": "melshards.extractors:onnx_model",
                "options": {
                    "path": model_path,
                    "name": "tiny_embedding",
                    "sample_rate": 16000,
                    "outputs": [{"name": "speaker_embedding", "kind": "vector", "dim": 4}],
                },
            }
        ],
        **QUALITY_RULES_OFF,
    }


def _seconds(path: Path) -> float:
    y, sr = sf.read(str(path))
    return len(y) / sr


def write_corpora(root: Path) -> None:
    """Every input kind under `root` (`INPUTS`), each with rows the job rejects (the JSONL manifest and the
    segments a row each whose audio file is not there), the TextGrid of every clip that has audio and
    text in `root/alignments`, and the extractor's model at `root/MODEL`."""
    from examples.extractors import build_onnx_embedding
    from melshards.preprocess.inputs.layouts import VCTK_AUDIO_DIR

    write_vctk(root / "vctk", real_audio=True)
    write_libritts(root / "LibriTTS", real_audio=True)
    write_commonvoice(root / "cv" / "cy", real_audio=True)
    write_wav_manifest(root / "csv")
    (root / "jsonl").mkdir()
    with open(root / "jsonl" / "lines.jsonl", "w") as f:
        for cid, speaker, text, _, _ in CLIPS:
            (root / "jsonl" / f"{cid}.wav").write_bytes((root / "csv" / "wavs" / f"{cid}.wav").read_bytes())
            f.write(json.dumps({"audio": f"{cid}.wav", "text": text, "id": cid, "speaker": speaker, "language": "en"}))
            f.write("\n")
        f.write(json.dumps({"audio": "gone.flac", "text": "its file is gone", "id": "gone", "language": "en"}) + "\n")
    write_parquet(root / "parquet" / "train.parquet")
    write_tar(root / "tar" / "000000.tar")
    with open(write_long(root / "long"), "a", newline="") as f:
        csv.writer(f).writerow(["lost", "lost.flac", "its recording is gone", "A", "en", "0.5", "1.0"])
    (root / MODEL).parent.mkdir()
    build_onnx_embedding(root / MODEL)

    aligned = root / "alignments"  # one TextGrid per id: u1..u4 are the same utterance in five inputs
    for cid, _, text, seconds, _ in CLIPS:
        write_textgrid(aligned / f"{cid}.TextGrid", text, int(seconds * SR) / SR)
    for cid in ("gone", "lost"):  # a row's TextGrid is read before its audio: theirs are there
        write_textgrid(aligned / f"{cid}.TextGrid", "gone", 0.5)
    for txt in sorted((root / "vctk" / "txt").rglob("*.txt")):
        flac = root / "vctk" / VCTK_AUDIO_DIR / txt.parent.name / f"{txt.stem}_mic1.flac"
        if flac.exists():
            write_textgrid(aligned / f"{txt.stem}.TextGrid", txt.read_text(), _seconds(flac))
    for txt in sorted((root / "LibriTTS").rglob("*.normalized.txt")):
        utt = txt.name.removesuffix(".normalized.txt")
        write_textgrid(aligned / f"{utt}.TextGrid", txt.read_text(), _seconds(txt.parent / f"{utt}.wav"))
    with open(root / "cv" / "cy" / "validated.tsv") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            mp3 = root / "cv" / "cy" / "clips" / row["path"]
            write_textgrid(aligned / f"{mp3.stem}.TextGrid", row["sentence"], _seconds(mp3))


def preprocess(inputs: list[str], out: str, config: Path, *extra: str) -> int:
    from melshards.commands.preprocess import run

    args = [a for path in inputs for a in ("--input", path)]
    return run([*args, "--output", out, "--config", str(config), "--language", "en", "--workers", "1", *extra])


def shard_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("*.tfrecord"))}


def rejections(run_dir: Path) -> list[tuple[str, str]]:
    """(id, reason) of each rejected row; the details name paths, which differ between local and gs://."""
    return [(r["id"], r["reason"]) for r in map(json.loads, (run_dir / "rejected.jsonl").read_text().splitlines())]


def objects(gcs, url: str) -> dict[str, int]:
    """The objects under gs:// `url` -> their generation."""
    bucket, prefix = gcs_bucket(gcs, url)
    return {b.name[len(prefix) + 1 :]: b.generation for b in bucket.client.list_blobs(bucket, prefix=f"{prefix}/")}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpora")
    write_corpora(root)
    (root / "local.yaml").write_text(yaml.safe_dump(_config(str(root / MODEL))))
    return root


@pytest.fixture(scope="module")
def local_run(corpora, tmp_path_factory) -> Path:
    """The corpora read from local files, their TextGrids and model local too, without a cache."""
    out = tmp_path_factory.mktemp("local") / "run"
    code = preprocess(
        [str(corpora / p) for _, p in INPUTS],
        str(out),
        corpora / "local.yaml",
        "--alignments",
        str(corpora / "alignments"),
    )
    assert code == 0
    return out


def clip_keys(gcs, cache_dir: str) -> list[str]:
    """The key of each clip in the complete entries files of a gs:// cache (their `.keys` files, written
    last), repeats included."""
    bucket, prefix = gcs_bucket(gcs, cache_dir)
    found = []
    for blob in bucket.client.list_blobs(bucket, prefix=f"{prefix}/entries/"):
        if blob.name.endswith(".keys"):
            lines = blob.download_as_bytes().decode().splitlines()
            found += [line.split()[0] for line in lines if line.split()[1:] == ["clip"]]
    return found


def kill_when(args: list, ready) -> None:
    """`preprocess(*args)` in a child of this process, killed with SIGKILL (the child and its job process's
    group: no clean-up runs, as after the out-of-memory killer or a scheduler's kill) at the first poll that
    finds `ready()` true."""
    pid = os.fork()
    if pid == 0:  # the command: never returns
        code = 1
        try:
            code = preprocess(*args)
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never got ready to be killed"
            time.sleep(0.02)
    finally:
        job = descendants(pid)
        for group in {os.getpgid(p) for p in job if running(p)} - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        deadline = time.monotonic() + 60
        while any(running(p) for p in job) and time.monotonic() < deadline:
            time.sleep(0.02)


@pytest.fixture(scope="module")
def remote(gcs, corpora, tmp_path_factory):
    """The corpora, their TextGrids and the model uploaded to a bucket and preprocessed from there into
    gs://BUCKET/out with a cache in gs://BUCKET/cache: a first run killed once its first batch is in the
    cache, the same command again (it resumes: `resumed`), and again with `--overwrite` (every clip in the
    cache: `warm`). Each finished run's files are downloaded."""
    bucket = _new_bucket(gcs)
    root = f"gs://{bucket}"
    upload_tree(gcs, corpora, f"{root}/corpora")
    config = tmp_path_factory.mktemp("remote") / "remote.yaml"
    config.write_text(yaml.safe_dump(_config(f"{root}/corpora/{MODEL}")))
    inputs = [f"{root}/corpora/{p}" for _, p in INPUTS]
    extra = ("--alignments", f"{root}/corpora/alignments", "--cache", f"{root}/cache")
    found = {"gcs": gcs, "bucket": bucket, "root": root, "local": tmp_path_factory.mktemp("downloads")}

    kill_when([inputs, f"{root}/out", config, *extra], ready=lambda: clip_keys(gcs, f"{root}/cache"))
    found["left_by_killed"] = objects(gcs, f"{root}/out")
    found["cache_after_kill"] = objects(gcs, f"{root}/cache")
    found["kept"] = clip_keys(gcs, f"{root}/cache")
    bucket_, prefix = gcs_bucket(gcs, f"{root}/out")
    found["killed"] = json.loads(bucket_.blob(f"{prefix}/.melshards-lock").download_as_bytes())

    for name, more in (("resumed", ()), ("warm", ("--overwrite",))):
        gcs.reset_counts()
        assert preprocess(inputs, f"{root}/out", config, *extra, *more) == 0
        found[f"{name}_served"] = list(gcs.served)
        download_tree(gcs, f"{root}/out", found["local"] / name)
        found[f"{name}_objects"] = objects(gcs, f"{root}/out")
        found[f"{name}_keys"] = clip_keys(gcs, f"{root}/cache")
    return found


def _stats(run_dir: Path) -> dict:
    return json.loads((run_dir / "stats.json").read_text())


def test_every_input_kind_read_from_gcs_gives_the_records_of_the_same_files_read_locally(local_run, remote):
    """VCTK, LibriTTS, Common Voice, CSV and JSONL manifests, parquet, WebDataset tars and segments of a long
    recording, with TextGrids and the extractor's model, all on gs://: the shards are the local run's, byte
    for byte, and so are the rejected rows and the counts."""
    resumed = remote["local"] / "resumed"
    local, got = _stats(local_run), _stats(resumed)
    assert shard_files(resumed) and shard_files(resumed) == shard_files(local_run)
    assert rejections(resumed) == rejections(local_run)
    assert {("gone", "missing_audio"), ("lost", "missing_audio")} <= set(rejections(resumed))
    assert got["counts"] == local["counts"] and got["counts"]["in_shards"] == 30
    kinds = [(i["format"], i["rows"], i.get("unused_columns", [])) for i in got["inputs"]]
    assert kinds == [(i["format"], i["rows"], i.get("unused_columns", [])) for i in local["inputs"]]
    assert [k[0] for k in kinds] == [
        "vctk",
        "libritts",
        "commonvoice",
        "manifest",
        "manifest",
        "parquet",
        "webdataset",
        "manifest",
    ]
    schema = json.loads((resumed / "schema.json").read_text())
    assert {"durations", "speaker_embedding"} <= {f["name"] for f in schema["buckets"][0]["features"]}


def test_a_run_killed_on_gcs_is_resumed_by_the_next_which_takes_its_lock_over_and_computes_only_the_rest(remote):
    """A SIGKILL leaves the lock (its holder's process gone), the staging dir, the cache lease and the
    batches it finished on gs://: the next run takes the lock over, removes the staging dir, as locally,
    and computes only the clips the cache lacks; `cache prune` then forgets the dead run's lease."""
    from click.testing import CliRunner

    from melshards.commands.cache import cache_command
    from melshards.preprocess.out_dir import lock, staging

    killed, root = remote["killed"], remote["root"]
    stage = f"{staging.STAGE_PREFIX}{killed['run_id']}"
    assert {lock.LOCK_FILE, f"{stage}/{staging.RUN_FILE}"} <= set(remote["left_by_killed"])
    lease = f"runs/{stage.lstrip('.')}.live"  # as a run names its lease
    assert lease in remote["cache_after_kill"]
    # the next run published, and nothing of the killed one (nor of its own staging) is left in the output
    assert not [name for name in remote["resumed_objects"] if name.startswith(".melshards")]
    stats, kept, clips = _stats(remote["local"] / "resumed"), remote["kept"], len(remote["resumed_keys"])
    assert stats["cache"]["hits"] == len(set(kept)) > 0 and stats["cache"]["computed"] == clips - len(set(kept)) > 0
    assert len(set(remote["resumed_keys"])) == clips  # no clip computed twice

    pruned = CliRunner().invoke(cache_command, ["prune", f"{root}/cache"])
    assert pruned.exit_code == 0 and pruned.output == f"{root}/cache: removed 0 file(s), 0 B\n", pruned.output
    after = objects_of(remote, "cache")
    assert lease not in after and any(name.startswith("entries/") for name in after)
    info = CliRunner().invoke(cache_command, ["info", f"{root}/cache"])
    assert info.exit_code == 0 and f"{root}/cache: {clips} clips in " in info.output, info.output


def test_a_warm_rerun_reads_every_clip_from_the_gcs_cache_and_no_audio_file(remote):
    warm = _stats(remote["local"] / "warm")
    assert warm["cache"]["hits"] == len(remote["resumed_keys"]) and warm["cache"]["computed"] == 0
    assert shard_files(remote["local"] / "warm") == shard_files(remote["local"] / "resumed")
    served = remote["warm_served"]
    assert sum(s.media_bytes for s in served if f"/{remote['bucket']}/o/cache%2Fentries%2F" in s.path) > 0
    audio = (".wav", ".flac", ".mp3")
    assert [s.path for s in served if s.media_bytes and s.path.split("?")[0].endswith(audio)] == []


def objects_of(remote, under: str) -> dict[str, int]:
    return objects(remote["gcs"], f"{remote['root']}/{under}")


def test_a_publish_cut_short_on_gcs_is_finished_by_the_next_run_that_takes_the_directory(remote):
    """Killed while it moved a finished run into place: the old schema.json gone, one shard moved, the
    rest staged. The next run to take the directory finishes that publish from the journal first."""
    from melshards.preprocess.out_dir import staging
    from melshards.shards_schema.schema import PUBLISH_JOURNAL

    run_id, new = "20260101-000000-abcdef12", remote["local"] / "resumed"
    stage, names = f"{staging.STAGE_PREFIX}{run_id}", sorted(p.name for p in new.iterdir())
    out = f"{remote['root']}/cut"
    bucket, prefix = gcs_bucket(remote["gcs"], out)
    for name in names:  # the earlier run in place, and the new one staged
        bucket.blob(f"{prefix}/{name}").upload_from_filename(str(remote["local"] / "warm" / name))
        bucket.blob(f"{prefix}/{stage}/{name}").upload_from_filename(str(new / name))
    bucket.blob(f"{prefix}/{stage}/{staging.RUN_FILE}").upload_from_string(json.dumps({"run_id": run_id}))
    journal = {"run_id": run_id, "stage": stage, "remove": names, "move": names}
    bucket.blob(f"{prefix}/{PUBLISH_JOURNAL}").upload_from_string(json.dumps(journal))
    bucket.blob(f"{prefix}/schema.json").delete()
    shard = next(n for n in names if n.endswith(".tfrecord"))
    bucket.rename_blob(bucket.blob(f"{prefix}/{stage}/{shard}"), f"{prefix}/{shard}")

    said: list[str] = []
    run = staging.open_run(out, overwrite=True, echo=said.append)
    staging.close_run(run, ok=False)
    assert said == [f"finishing the publish of run {run_id} that was cut short in {out}"]
    assert sorted(objects_of(remote, "cut")) == names
    assert all(bucket.blob(f"{prefix}/{n}").download_as_bytes() == (new / n).read_bytes() for n in names)


def test_overwrite_on_gcs_replaces_every_file_of_its_own_earlier_run(remote):
    """The warm run (`--overwrite`) published over the resumed one: the output holds exactly the new run's
    files (what its schema.json lists and its three reports), each written anew."""
    from melshards.preprocess.out_dir import staging
    from melshards.shards_schema import Schema

    warm = remote["local"] / "warm"
    listed = staging.run_files(Schema.from_json((warm / "schema.json").read_text()))
    assert sorted(remote["warm_objects"]) == listed
    before = remote["resumed_objects"]
    assert sorted(before) == listed  # the same records: the same names, every one replaced
    assert all(remote["warm_objects"][name] != before[name] for name in listed)


@pytest.mark.parametrize("users", ["files", "schema"])
def test_overwrite_on_gcs_refuses_a_directory_it_cannot_prove_it_made_and_changes_nothing(
    gcs, remote, corpora, capsys, users
):
    """A report and a shard-named file of the user's, or a copy of a run's schema.json without its shards:
    refused with `--overwrite` too, in one line naming them; no object is written, changed or removed."""
    bucket, _ = gcs_bucket(gcs, f"{remote['root']}/theirs-{users}")
    prefix = f"theirs-{users}"
    if users == "files":
        for name in ("stats.json", "train-mine.tfrecord"):
            bucket.blob(f"{prefix}/{name}").upload_from_string(b"the user's")
    else:
        bucket.blob(f"{prefix}/schema.json").upload_from_filename(str(remote["local"] / "resumed" / "schema.json"))
    before = objects_of(remote, prefix)
    out = f"{remote['root']}/{prefix}"
    assert preprocess([str(corpora / "csv" / "clips.csv")], out, corpora / "local.yaml", "--overwrite") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if users == "files":
        assert "holds files that melshards did not write" in err and "stats.json, train-mine.tfrecord" in err
    else:
        assert "holds a schema.json without any of the shards it lists" in err
    assert objects_of(remote, prefix) == before


def test_a_second_run_into_a_gcs_output_a_live_run_holds_stops_at_once_naming_the_holder(remote, corpora, capsys):
    from melshards.preprocess.out_dir import lock

    out = f"{remote['root']}/held"
    holder = lock.Lock(out, "first")
    holder.acquire()
    try:
        assert preprocess([str(corpora / "csv" / "clips.csv")], out, corpora / "local.yaml") == 2
        err = capsys.readouterr().err
        assert "is in use by another melshards preprocess run first" in err and f"pid {os.getpid()}" in err
        assert list(objects_of(remote, "held")) == [lock.LOCK_FILE]
    finally:
        holder.release()
    assert objects_of(remote, "held") == {}


def test_the_gcs_lock_is_created_renewed_and_removed_only_at_the_generation_it_read(remote):
    """The lock's compare-and-swap on a real GCS: google-cloud-storage's generation preconditions as the
    server applies them."""
    from melshards.preprocess.out_dir import lock

    out = f"{remote['root']}/cas"
    first = lock.Lock(out, "first")
    first.acquire()
    with pytest.raises(lock.OutputBusyError, match="run first"):
        lock.Lock(out, "second").acquire()
    created = first.token
    assert first.renew() and first.token != created and first.still_held()
    assert first.marker.replace(b"{}", created) is None and first.marker.delete(created) is False  # old generation
    # a holder on another machine, silent for longer than the stale limit: taken over at that generation only
    stale = json.loads(first.marker.read()[0]) | {"host": "elsewhere", "heartbeat": 1.0}
    assert first.marker.replace(json.dumps(stale).encode(), first.token) is not None
    third = lock.Lock(out, "third")
    third.acquire()
    assert json.loads(third.marker.read()[0])["run_id"] == "third"
    assert not first.still_held() and first.renew() is False  # the first learns it lost the lock
    first.release()  # removes nothing: the object is not at its generation
    assert third.still_held()
    third.release()
    assert third.marker.read() is None


def test_stats_of_a_gcs_run_reads_it_as_the_same_run_downloaded_and_writes_its_html_report_to_gcs(remote):
    """`melshards stats` reads stats.json, schema.json and rejected.jsonl (each reason's example ids)
    through Beam's FileSystems; its --html goes to gs:// too, and never over a file it did not write."""
    from click.testing import CliRunner

    from melshards.commands.stats import stats_command

    out, copy = f"{remote['root']}/out", remote["local"] / "warm"
    shown = CliRunner().invoke(stats_command, [out])
    assert shown.exit_code == 0, shown.output
    local = CliRunner().invoke(stats_command, [str(copy)])
    assert shown.output.replace(f"{out}/stats.json", "RUN") == local.output.replace(f"{copy}/stats.json", "RUN")
    figures, local_figures = (
        json.loads(CliRunner().invoke(stats_command, [p, "--json"]).output) for p in (out, str(copy))
    )
    assert (figures.pop("source"), figures.pop("rejected_file")) == (f"{out}/stats.json", f"{out}/rejected.jsonl")
    assert figures == {k: v for k, v in local_figures.items() if k not in ("source", "rejected_file")}
    assert "p315_001" in json.dumps(figures["reasons"])  # an example id, from rejected.jsonl

    html = CliRunner().invoke(stats_command, [out, "--html", f"{remote['root']}/report.html"])
    assert html.exit_code == 0, html.output
    bucket, _ = gcs_bucket(remote["gcs"], out)
    assert bucket.blob("report.html").download_as_bytes().startswith(b"<!DOCTYPE html>")
    before = objects_of(remote, "out")
    refused = CliRunner().invoke(stats_command, [out, "--html", f"{out}/stats.json"])
    assert refused.exit_code == 2 and "is not an HTML report `melshards stats --html` wrote" in refused.output
    assert objects_of(remote, "out") == before


@pytest.mark.parametrize("locator", [None, {"start": 0.5, "end": 1.0}], ids=["file", "segment"])
def test_a_clip_whose_gcs_object_is_missing_is_a_missing_audio_rejection_not_the_jobs_end(gcs, locator):
    """Beam's GcsIO raises the GCS client's NotFound, no OSError, for an object that is not there: read as
    a local file's FileNotFoundError is, the row is rejected and the job goes on."""
    from melshards.preprocess.clip.clips import ClipRejected, load_decoded
    from melshards.preprocess.config import PreprocessConfig

    path = f"gs://{_new_bucket(gcs)}/corpus/gone.flac"
    with pytest.raises(ClipRejected) as e:
        load_decoded(path, PreprocessConfig(), locator)
    assert (e.value.reason, e.value.detail) == ("missing_audio", f"{path} does not exist")
