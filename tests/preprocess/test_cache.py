"""The feature cache (`preprocess --cache DIR`): warm re-runs decode nothing and write the same records,
changed files and settings are recomputed, damaged entries are recomputed and counted, concurrent
writers never corrupt an entry, new rows are the only ones computed, a run killed with SIGKILL keeps
what it computed; `melshards cache info|prune`."""

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from melshards.commands.cache import cache_command
from melshards.commands.preprocess import run
from melshards.preprocess.clip import audio, cache, quality
from melshards.preprocess.out_dir import lock, staging
from melshards.shards_schema.stats import Moments
from tests.conftest import CORPUS, TINY_CONFIG
from tests.preprocess.conftest import (
    CallLog,
    decoded_records,
    descendants,
    preprocess_command,
    running,
    start_long_run,
)


def _run(out, cache_dir=None, *extra, corpus=CORPUS):
    args = ["--input", str(corpus), "--output", str(out), "--config", str(TINY_CONFIG), "--workers", "1", *extra]
    assert run(args + (["--cache", str(cache_dir)] if cache_dir else [])) == 0
    return json.loads((out / "stats.json").read_text())


def records(out) -> dict[bytes, bytes]:
    """Every record of a run by its id: the serialized bytes."""
    import tensorflow as tf

    found = {}
    for f in sorted(out.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(f)):
            ex = tf.train.Example.FromString(raw.numpy())
            found[ex.features.feature["id"].bytes_list.value[0]] = raw.numpy()
    return found


def without_id(raw: bytes) -> bytes:
    """A serialized record without its id feature."""
    import tensorflow as tf

    example = tf.train.Example.FromString(raw)
    del example.features.feature["id"]
    return example.SerializeToString(deterministic=True)


def audio_rejections(stats) -> int:
    """Clips rejected for their audio: decoded on every run, the cache keeps no entry for them."""
    return sum(stats["counts"]["per_reason"].get(r, 0) for r in ("silent_audio", "unreadable_audio", "invalid_samples"))


@pytest.fixture
def decodes(monkeypatch, tmp_path):
    calls = CallLog(tmp_path / "decodes")
    real = audio.decode_audio
    monkeypatch.setattr(audio, "decode_audio", lambda *a: calls.append(1) or real(*a))
    return calls


def record_measured(monkeypatch, path) -> CallLog:
    """Every measured batch the runs from now on write for the writer: (clips, features), logged to `path`."""
    from melshards.preprocess.clip import measure_stage

    calls, real = CallLog(path), measure_stage.write_measured
    monkeypatch.setattr(
        measure_stage,
        "write_measured",
        lambda d, clips, features: calls.append((clips, features)) or real(d, clips, features),
    )
    return calls


@pytest.fixture
def measured(monkeypatch, tmp_path):
    return record_measured(monkeypatch, tmp_path / "measured")


def assert_writes_no_array_the_cache_holds(calls: CallLog, stats: dict, cache_dir) -> None:
    """Computed or found, a cached clip's arrays are written once, to the cache: the writer reads them there."""
    written = calls.items()
    clips = [c for batch, _ in written for c in batch]
    assert len(clips) == stats["cache"]["hits"] + stats["cache"]["computed"] == 47, "a clip written twice or not"
    assert all(c["cached"][0].startswith(str(cache_dir)) for c in clips), (
        "a clip the writer does not read from the cache"
    )
    assert all(not f for _, features in written for f in features), "an array written that the cache holds"


@pytest.fixture(scope="module")
def warm(tmp_path_factory, bucketed_dir):
    """A cache filled by one run (what that run wrote for the writer checked), and in `plain` a run
    without a cache for reference: the session's `bucketed_dir` (`--buckets 4` is what the demo config's
    `auto` chooses: the same records and schema.json). Read-only."""
    from melshards.preprocess.write import report

    tmp = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = record_measured(monkeypatch, tmp / "measured")
        removals, real = CallLog(tmp / "temp-dir-removals"), report.remove_temp_dir  # for the report's test
        monkeypatch.setattr(
            report,
            "remove_temp_dir",
            lambda out_dir: removals.append((Path(out_dir) / "schema.json").exists()) or real(out_dir),
        )
        cold = _run(tmp / "cold", tmp / "cache")
    assert_writes_no_array_the_cache_holds(calls, cold, tmp / "cache")
    (tmp / "plain").symlink_to(bucketed_dir)
    return tmp, cold


def test_the_report_writes_schema_json_into_its_temp_dir_before_it_removes_that_dir(warm):
    """A crash between the two once left both behind, and preprocess and train disagreed on whether the
    run had finished. (The warm cache's first run, a real one, is the run looked at.)"""
    tmp, _ = warm
    assert CallLog(tmp / "temp-dir-removals").items() == [True], "the temp dir was removed before schema.json"


def test_a_warm_rerun_with_other_buckets_decodes_no_audio_writes_no_array_the_cache_holds_and_writes_the_same_records(
    warm, tmp_path, decodes, measured, shards_dir
):
    """The cache was filled with the demo config's 4 buckets; a rerun with 1 bucket (other cutoffs, other
    padding) still reads every clip from it, and writes what a run without a cache writes (shards_dir:
    1 bucket), as the cold run that filled it wrote what `plain` holds."""
    tmp, cold = warm
    assert cold["cache"]["hits"] == 0 and cold["cache"]["computed"] == 47
    assert records(tmp / "cold") == records(tmp / "plain")
    stats = _run(tmp_path / "again", tmp / "cache", "--buckets", "1")
    # only the clips whose audio was rejected (never cached) are decoded again
    assert len(decodes) == audio_rejections(cold) > 0
    assert stats["cache"]["hits"] == 47 and stats["cache"]["computed"] == 0
    assert_writes_no_array_the_cache_holds(measured, stats, tmp / "cache")
    assert records(tmp_path / "again") == records(shards_dir)
    assert (tmp_path / "again" / "schema.json").read_text() == (shards_dir / "schema.json").read_text()


def mels(out) -> dict[bytes, bytes]:
    """Each record's mel by its id, without its padding (which follows the run's buckets): the bytes."""
    _, found = decoded_records(out)
    return {r["id"].numpy()[0]: r["mel"][0, : int(r["mel_len"][0])].numpy().tobytes() for r in found}


def test_only_new_rows_are_computed_and_a_changed_file_or_setting_is_computed_again_never_served_stale(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    cache_dir = tmp_path / "cache"
    meta = corpus / "metadata.csv"
    lines = meta.read_text(encoding="utf-8").splitlines(keepends=True)
    # the corpus's first 8 rows, then its first 16 with the first row's file changed: good clips all
    meta.write_text("".join(lines[:8]), encoding="utf-8")
    first = _run(tmp_path / "first", cache_dir, corpus=corpus)
    meta.write_text("".join(lines[:16]), encoding="utf-8")  # rows added
    wav = corpus / "wavs" / "LJT001-0001.wav"
    y, sr = sf.read(wav, dtype="float32")
    sf.write(wav, y[::-1] * 0.9, sr, subtype="PCM_16")  # other audio now (not another clip's: that is a duplicate)
    stats = _run(tmp_path / "b", cache_dir, corpus=corpus)
    assert first["cache"]["computed"] == 8
    assert stats["cache"]["hits"] == 7, (
        "rows added, a file changed: not just the unchanged old rows read from the cache"
    )
    assert stats["cache"]["computed"] == 8 + 1, "rows added, a file changed: not only the new rows and it computed"
    before, after = mels(tmp_path / "first"), mels(tmp_path / "b")
    assert after[b"LJT001-0001"] != before[b"LJT001-0001"], "a changed file: served stale"
    assert {k: v for k, v in after.items() if k in before and k != b"LJT001-0001"} == {
        k: v for k, v in before.items() if k != b"LJT001-0001"
    }, "a changed file: another record changed"


def _settings(cfg, extractors=()) -> dict[str, str]:
    return {p.name: p.settings for p in cache.run_parts(cfg, extractors)}


def _with(cfg, **sections):
    """`cfg` with fields of its sections replaced: _with(cfg, audio={"trim_top_db": 30.0})."""
    return dataclasses.replace(
        cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields) for name, fields in sections.items()}
    )


def test_each_part_of_an_entry_is_keyed_by_exactly_the_settings_it_depends_on():
    """A run with other settings never reads a part that depends on them, and reads every other part:
    turning a quality measure on or off computes no mel again (clip_key takes a part's settings)."""
    from melshards.preprocess.config import load_config

    plain = _with(load_config(str(TINY_CONFIG), None, None), features={"energy": True, "pitch": True, "audio": True})
    plain = _with(plain, quality={"loudness": True, "dnsmos": True})
    base = _settings(plain)
    assert list(base) == ["mel", "energy", "pitch", "audio", "measures", "loudness", "dnsmos"]
    assert _settings(dataclasses.replace(plain)) == base
    for change, parts in (
        ({"audio": {"sample_rate": 16000}, "mel": {"fmax": 7600.0}}, set(base)),
        ({"audio": {"silence_peak_dbfs": -40.0}}, set(base)),  # a cached clip skips the silence check
        ({"audio": {"trim_top_db": 30.0}}, set(base)),  # the trim, and the measures' pauses
        ({"audio": {"trim_silence": False, "trim_top_db": 30.0}}, set(base)),
        ({"audio": {"vad_aggressiveness": 3}}, set()),  # unused by the energy trim
        ({"audio": {"trim_method": "webrtcvad"}}, set(base)),
        ({"audio": {"loudness_target_lufs": -23.0}}, {"mel", "energy", "pitch", "audio"}),  # measured as decoded
        ({"mel": {"n_mels": 40}}, {"mel"}),
        ({"mel": {"fmax": 7600.0}}, {"mel"}),
        ({"mel": {"n_fft": 2048}}, {"mel", "energy", "measures"}),  # the STFT; bandwidth is one of its bins
        ({"mel": {"hop_length": 128}}, {"mel", "energy", "pitch", "audio", "measures"}),
        ({"pitch": {"fmax": 600.0}}, {"pitch"}),
        ({"pitch": {"tracker": "pyin"}}, {"pitch"}),
        ({"filter": {"min_duration_s": 1.0}, "split": {"val_fraction": 0.5}}, set()),
    ):
        changed = _settings(_with(plain, **change))
        assert set(changed) == set(base), change
        assert {p for p in base if changed[p] != base[p]} == parts, change
    vad = _with(plain, audio={"trim_method": "webrtcvad"})
    assert {
        p for p, s in _settings(_with(vad, audio={"vad_aggressiveness": 3})).items() if s != _settings(vad)[p]
    } == set(base)
    # a measure or feature turned off leaves its part out, turned on adds it: the others keep their keys
    for section, field, part in (
        ("quality", "loudness", "loudness"),
        ("quality", "dnsmos", "dnsmos"),
        ("features", "energy", "energy"),
        ("features", "pitch", "pitch"),
        ("features", "audio", "audio"),
    ):
        off = _settings(_with(plain, **{section: {field: False}}))
        assert off == {p: s for p, s in base.items() if p != part}, part
    unmeasured = _settings(_with(plain, quality={"measures": False}))
    assert unmeasured == {p: s for p, s in base.items() if p not in ("measures", "loudness")}


def test_an_extractors_part_is_keyed_by_its_record_options_included_and_no_other_part_by_it():
    from melshards.preprocess.config import ExtractorConfig, PreprocessConfig

    cfg = dataclasses.replace(PreprocessConfig(), extractors=(ExtractorConfig("examples.extractors:frame_loudness"),))
    record = {
        "name": "frame_loudness",
        "version": "1",
        "fingerprint": "aa",
        "factory": "examples.extractors:frame_loudness",
        "options": {"hop": 256},
        "sample_rate": 22050,
        "outputs": [{"name": "loudness", "kind": "frames"}],
    }
    base = _settings(cfg, [record])
    assert list(base) == ["mel", "measures", "extractor0:frame_loudness"]
    for change in ({"options": {"hop": 512}}, {"fingerprint": "bb"}, {"version": "2"}, {"sample_rate": 16000}):
        other = _settings(cfg, [dict(record, **change)])
        assert {p for p in base if other[p] != base[p]} == {"extractor0:frame_loudness"}, change
    assert _settings(cfg, [dict(record, factory="elsewhere:frame_loudness")]) == base  # the code is the fingerprint
    louder = _settings(_with(cfg, audio={"loudness_target_lufs": -23.0}), [record])
    assert {p for p in base if louder[p] != base[p]} == {
        "mel",
        "extractor0:frame_loudness",
    }  # it hears the normalised audio


def test_turning_a_quality_measure_on_computes_it_alone_and_reads_every_mel_from_the_cache(warm, tmp_path, monkeypatch):
    """The warm cache was filled without `quality.loudness`; a run with it measures loudness (a decode per
    clip) and computes no mel nor other measure, and writes the records the run without it wrote."""
    import yaml

    tmp, cold = warm
    shutil.copytree(tmp / "cache", tmp_path / "cache")
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["quality"] = {"loudness": True}
    (tmp_path / "loud.yaml").write_text(yaml.safe_dump(config))
    mels_made, measured = CallLog(tmp_path / "mels"), CallLog(tmp_path / "measured")
    real_mel, real_quality = audio.log_mel_of, quality.audio_quality
    monkeypatch.setattr(audio, "log_mel_of", lambda *a: mels_made.append(1) or real_mel(*a))
    monkeypatch.setattr(quality, "audio_quality", lambda *a: measured.append(a[4] is None) or real_quality(*a))
    args = ["--input", str(CORPUS), "--output", str(tmp_path / "loud"), "--config", str(tmp_path / "loud.yaml")]
    assert run([*args, "--workers", "1", "--cache", str(tmp_path / "cache")]) == 0
    stats = json.loads((tmp_path / "loud" / "stats.json").read_text())
    assert stats["cache"]["parts_computed"] == {"mel": 0, "measures": 0, "loudness": 47}
    assert stats["cache"]["computed"] == 47 and stats["cache"]["hits"] == 0
    assert len(mels_made) == 0, "a mel computed again for a quality measure"
    assert measured.items() == [True] * 47, "the measures computed again, or from an STFT"
    assert records(tmp_path / "loud") == records(tmp / "cold")
    loudness = stats["quality"]["global"]["loudness_lufs"]
    assert loudness["count"] > 40 and loudness["count"] + loudness["not_measured"] == 47


def test_a_damaged_cache_file_or_one_gone_from_under_the_writer_is_computed_again_and_prune_during_a_run_removes_nothing(
    warm, tmp_path, monkeypatch
):
    """A damaged entries file (truncated) is counted and its clips computed again. Once Measure has read
    the cache, the writer reads it back: a `prune --unused-days 0` then (the warm run's records are older
    than 0 days) must spare the live run's files, and a file gone all the same (removed by hand, or by a
    prune that raced the run's start) is computed again."""
    tmp, _ = warm
    cache_dir = tmp_path / "cache"
    shutil.copytree(tmp / "cache", cache_dir)
    victim = sorted((cache_dir / "entries").glob("*.npz"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated
    reads, pruned, real = [], CallLog(tmp_path / "pruned"), cache.read_batch  # reads: in the job process

    def read_batch(path):
        # the writer's first read-back of a sound file (the damaged one, computed again, is written back
        # under its old name: which of them the writer reads back first is the batches' order)
        if path in reads and path != str(victim) and not pruned.items():
            done = CliRunner().invoke(cache_command, ["prune", str(cache_dir), "--unused-days", "0"])
            pruned.append((done.exit_code, done.output, path))
            os.remove(path)
        reads.append(path)
        return real(path)

    monkeypatch.setattr(cache, "read_batch", read_batch)
    stats = _run(tmp_path / "out", cache_dir)
    ((exit_code, output, removed),) = pruned.items()
    assert exit_code == 0 and "removed 0 file(s)" in output
    assert "1 run(s) using the cache now" in output
    assert removed != str(victim)
    assert stats["cache"]["damaged_files"] == 1 and stats["cache"]["damaged"] >= 1
    # the damaged file's clips computed; the file removed under the writer was a hit for Measure
    assert stats["cache"]["computed"] == stats["cache"]["damaged"]
    assert stats["cache"]["hits"] + stats["cache"]["computed"] == 47
    assert records(tmp_path / "out") == records(tmp / "plain")
    assert not list((cache_dir / "runs").glob("*.live"))  # the run's lease went with it


def test_prune_forgets_a_stale_lease_and_honours_a_live_one(tmp_path):
    lease = cache.Lease(str(tmp_path), "r1").start()
    try:
        assert [h["run_id"] for h in cache.live_leases(str(tmp_path), time.time())[0]] == ["r1"]
        assert cache.live_leases(str(tmp_path), time.time() + 2 * lock.STALE_AFTER_S) == (
            [],
            [str(tmp_path / "runs" / "r1.live")],
        )
    finally:
        lease.release()
    assert not (tmp_path / "runs" / "r1.live").exists()
    (tmp_path / "runs" / "gone.live").write_text(
        json.dumps({"run_id": "gone", **lock.machine_identity(), "pid": 2**22 + 1, "heartbeat": time.time()})
    )
    assert cache.prune(str(tmp_path), 0, time.time()).live == []  # its process is gone from this process table
    assert not (tmp_path / "runs" / "gone.live").exists()


def test_a_flipped_byte_anywhere_in_an_entries_file_is_damage(tmp_path):
    mel = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    path = cache.write_batch(
        str(tmp_path), [(f"{0:064x}", {"samples": 100, "start": 3, "length": 90}, {"mel": mel}, Moments.of(mel))]
    )
    data = open(path, "rb").read()
    in_mel = data.index(mel.astype("<f2").tobytes()) + 100
    for at in (in_mel, 400, len(data) - 30):  # the mel's values, an early member, the zip's directory
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        with open(path, "wb") as f:
            f.write(bytes(flipped))
        with pytest.raises(cache.CacheDamaged):
            cache.read_batch(path)


def test_the_cache_index_finds_each_key_s_file_in_20_bytes_a_clip(tmp_path):
    same_hi = ["ab" * 8 + "00" * 8 + "f" * 32, "ab" * 8 + "01" * 8 + "f" * 32]  # the first 64 bits alike
    files = {"one": same_hi + ["cd" * 32], "two": ["ef" * 32, "cd" * 32], "empty": []}  # "cd..." is in both
    entries = tmp_path / "entries"
    entries.mkdir()
    for name, keys in files.items():
        (entries / f"{name}.keys").write_text("".join(k + "\n" for k in keys))
    (entries / "bad.keys").write_text("not hex\n")
    index = cache.read_index(str(tmp_path))
    where = {k: index.get(k) for k in same_hi + ["cd" * 32, "ef" * 32]}
    assert where == {
        same_hi[0]: str(entries / "one.npz"),
        same_hi[1]: str(entries / "one.npz"),
        "cd" * 32: str(entries / "one.npz"),
        "ef" * 32: str(entries / "two.npz"),
    }
    assert index.get("ab" * 8 + "02" * 8 + "f" * 32) is None and index.get("zz") is None and index.get(None) is None
    assert len(index) == 5 and index.hi.nbytes + index.lo.nbytes + index.file.nbytes == 20 * 5


def test_npz_arrays_reads_what_np_load_reads():
    import io

    arrays = {
        "f": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "scalar": np.array(5),
        "empty": np.zeros((0, 80), np.float16),
        "big_endian": np.arange(3, dtype=">i4"),
        "name/with/slashes": np.arange(4, dtype=np.int64),
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    back = cache.npz_arrays(buffer.getvalue())
    assert sorted(back) == sorted(arrays)
    for name, want in arrays.items():
        assert back[name].dtype == want.dtype and back[name].shape == want.shape
        np.testing.assert_array_equal(back[name], want)
    compressed = io.BytesIO()
    np.savez_compressed(compressed, **arrays)
    with pytest.raises(ValueError, match="compressed"):
        cache.npz_arrays(compressed.getvalue())


def _entries(keys, tag: int, frames: int) -> list:
    """Entries whose arrays all carry `tag` (which writer made them)."""
    mel = np.full((frames, 80), tag, np.float32)
    return [
        (
            k,
            {"samples": frames * 4, "start": tag, "length": frames * 4},
            {"mel": mel, "pitch": mel[:, 0]},
            Moments.of(mel),
        )
        for k in keys
    ]


def _write_rounds(cache_dir: str, tag: int, shared: list[str], go, rounds: int) -> None:
    """One writer process: the shared batch, with its own arrays, and a batch of keys of its own, `rounds` times."""
    go.wait()
    own = [f"{tag:08x}{i:056x}" for i in range(3)]
    for _ in range(rounds):
        cache.write_batch(cache_dir, _entries(shared, tag, 1000))
        cache.write_batch(cache_dir, _entries(own, tag, 500))


def test_concurrent_writer_processes_never_leave_or_show_a_mixed_or_partial_entries_file(tmp_path):
    """8 processes write one batch's keys with arrays of their own (as two workers computing the same
    clips could), and batches of their own, while this process reads the shared batch back: every read
    is whole and one writer's, and every batch is there at the end."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the children run numpy and Beam's file system only
    shared = [f"{i:064x}" for i in range(4)]
    go = ctx.Event()
    writers = [ctx.Process(target=_write_rounds, args=(str(tmp_path), tag, shared, go, 6)) for tag in range(1, 9)]
    for w in writers:
        w.start()
    go.set()
    path, seen = str(tmp_path / "entries" / f"{cache.batch_name(shared)}.npz"), set()
    while any(w.is_alive() for w in writers):
        if os.path.exists(path[:-4] + ".keys"):
            back = cache.read_batch(path)  # CacheDamaged: a reader saw a partial or mixed file
            assert sorted(back) == shared
            tags = {span["start"] for span, _, _ in back.values()}
            assert len(tags) == 1  # one writer's entries, not a mix
            assert all(
                (a["mel"] == span["start"]).all() and (a["pitch"] == span["start"]).all()
                for span, a, _ in back.values()
            )
            seen |= tags
        time.sleep(0.005)
    for w in writers:
        w.join()
        assert w.exitcode == 0
    back = cache.read_batch(path)
    assert sorted(back) == shared and len({span["start"] for span, _, _ in back.values()}) == 1
    for tag in range(1, 9):
        own = [f"{tag:08x}{i:056x}" for i in range(3)]
        entries = cache.read_batch(str(tmp_path / "entries" / f"{cache.batch_name(own)}.npz"))
        assert all((a["mel"] == tag).all() and s["start"] == tag for s, a, _ in entries.values())
    assert len(list(tmp_path.glob("entries/*.npz"))) == 9 and not list(tmp_path.glob("entries/*.writing"))
    assert seen  # the reader read the shared batch while the writers wrote it


def test_a_cache_inside_the_output_directory_is_refused(tmp_path, capsys):
    code = run(["--input", str(CORPUS), "--output", str(tmp_path / "out"), "--cache", str(tmp_path / "out" / "c")])
    assert code == 2 and "inside --output" in capsys.readouterr().err


def test_a_cache_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "cache").write_text("mine")
    code = run(["--input", str(CORPUS), "--output", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2 and "is a file, not a directory" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and (tmp_path / "cache").read_text() == "mine"


def test_a_cache_the_run_cannot_write_is_refused_with_the_file_system_s_reason(tmp_path, monkeypatch):
    def read_only(path, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(cache, "atomic_write", read_only)
    with pytest.raises(staging.OutputError, match=r"--cache .* cannot be written \(.*entries: Permission denied\)"):
        cache.check_writable(str(tmp_path / "cache"))


def test_a_cache_whose_path_holds_glob_characters_is_written_listed_and_pruned_as_spelt(tmp_path):
    """`--cache "dir [x]"` was refused as unwritable (Beam's FileSystems read `[x]` as a pattern) and its
    probe file was left behind."""
    cache_dir = tmp_path / "c [x]*?"
    (tmp_path / "c x").mkdir()  # what `[x]` matches as a pattern: never read as the cache
    (tmp_path / "c x" / "entries").mkdir()
    cache.check_writable(str(cache_dir))
    assert sorted(p.name for p in cache_dir.rglob("*")) == ["entries", "runs"]  # no probe left
    mel = np.zeros((4, 8), np.float32)
    key = f"{7:064x}"
    path = cache.write_batch(
        str(cache_dir), [(key, {"samples": 10, "start": 0, "length": 10}, {"mel": mel}, Moments.of(mel))]
    )
    assert cache.read_index(str(cache_dir)).get(key) == path
    lease = cache.Lease(str(cache_dir), "r1").start()
    assert [h["run_id"] for h in cache.live_leases(str(cache_dir), time.time())[0]] == ["r1"]
    lease.release()
    assert not (cache_dir / "runs" / "r1.live").exists()
    out = CliRunner().invoke(cache_command, ["info", str(cache_dir)])
    assert out.exit_code == 0 and "1 clips in 1 files" in out.output, out.output
    old = time.time() - 86400
    for f in (cache_dir / "entries").iterdir():
        os.utime(f, (old, old))
    out = CliRunner().invoke(cache_command, ["prune", str(cache_dir), "--unused-days", "0.5"])
    assert out.exit_code == 0 and "removed 1 file(s)" in out.output, out.output
    assert not list((cache_dir / "entries").iterdir())


@pytest.mark.parametrize(
    "command, given, says",
    [
        ("prune", "missing", "no such directory"),
        ("info", "missing", "no such directory"),
        ("info", "file", "a file, not a cache directory"),
        ("prune", "file", "a file, not a cache directory"),
    ],
)
def test_cache_info_or_prune_of_a_missing_directory_or_a_file_is_refused_in_one_line(tmp_path, command, given, says):
    """`cache prune` of a mistyped directory said "removed 0 file(s)" and exited 0; `cache info FILE`
    suggested the file as a cache."""
    (tmp_path / "file").write_text("mine")
    out = CliRunner().invoke(cache_command, [command, str(tmp_path / given)])
    (line,) = [line for line in out.output.splitlines() if line.startswith("Error:")]
    assert out.exit_code == 2 and line == (
        f"Error: {tmp_path / given}: {says}; give the directory a run was given as `melshards preprocess --cache DIR`"
    ), out.output
    assert "Traceback" not in out.output and (tmp_path / "file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_cache_info_and_prune(warm, tmp_path):
    tmp, _ = warm
    cache_dir = tmp_path / "cache"
    shutil.copytree(tmp / "cache", cache_dir)
    (cache_dir / "entries" / "notes.txt").write_text("not ours")
    out = CliRunner().invoke(cache_command, ["info", str(cache_dir)])
    assert out.exit_code == 0 and "47 clips in" in out.output and "0 file(s) no recorded run used" in out.output
    out = CliRunner().invoke(cache_command, ["prune", str(cache_dir)])
    assert "removed 0 file(s)" in out.output
    out = CliRunner().invoke(cache_command, ["prune", str(cache_dir), "--unused-days", "0"])
    assert out.exit_code == 0 and not list((cache_dir / "entries").glob("*.npz"))
    assert (cache_dir / "entries" / "notes.txt").exists()  # only files the cache wrote are removed


def test_prune_spares_entries_written_within_the_window_that_no_finished_run_recorded_yet(warm, tmp_path):
    tmp, _ = warm
    cache_dir = tmp_path / "cache"
    shutil.copytree(tmp / "cache", cache_dir)
    for record in (cache_dir / "runs").glob("*.txt"):  # as while the run that writes them is still going
        record.unlink()
    entries = sorted((cache_dir / "entries").glob("*.npz"))
    for f in entries:
        os.utime(f)  # written now
    out = CliRunner().invoke(cache_command, ["prune", str(cache_dir), "--unused-days", "1"])
    assert out.exit_code == 0 and "removed 0 file(s)" in out.output
    two_days_ago = entries[0].stat().st_mtime - 2 * 86400
    os.utime(entries[0], (two_days_ago, two_days_ago))
    out = CliRunner().invoke(cache_command, ["prune", str(cache_dir), "--unused-days", "1"])
    assert sorted((cache_dir / "entries").glob("*.npz")) == entries[1:]


def test_a_warm_rerun_with_every_feature_and_durations_writes_the_same_records(features_dir, tmp_path):
    """The session's features_dir run (tests/conftest.py: pitch, energy, audio and durations from TextGrids)
    filled a cache; a rerun from (a copy of) it computes nothing and writes that run's records."""
    root = features_dir.parent
    shutil.copytree(root / "cache", tmp_path / "cache")
    cold = json.loads((features_dir / "stats.json").read_text())["cache"]
    out = tmp_path / "warm"
    args = ["--input", str(CORPUS), "--output", str(out), "--config", str(root / "features.yaml"), "--workers", "1"]
    assert run([*args, "--alignments", str(root / "alignments"), "--cache", str(tmp_path / "cache")]) == 0
    warm = json.loads((out / "stats.json").read_text())["cache"]
    assert cold["hits"] == 0 and warm["computed"] == 0 and warm["hits"] == cold["computed"] > 40
    assert records(out) == records(features_dir)
    assert (out / "schema.json").read_text() == (features_dir / "schema.json").read_text()


def cached_keys(cache_dir) -> list[str]:
    """The key of each clip's span entry (its mel part: one a clip, marked in the keys files) of every
    complete entries file, repeats included."""
    files = sorted((cache_dir / "entries").glob("*.keys"))
    return [line.split()[0] for f in files for line in f.read_text().splitlines() if line.split()[1:] == ["clip"]]


def test_a_run_killed_with_sigkill_keeps_what_it_computed_and_the_rerun_computes_only_the_rest(tmp_path, corpus_dir):
    # 80 rows: 16 batches of 5 (read_stage.batch_rows); killed at the first poll (every 20 ms) that finds one
    # cached, while the other 15 and the stages after them take seconds
    rows, out, cache_dir = 80, tmp_path / "out", tmp_path / "cache"
    extra = ("--workers", "2", "--cache", str(cache_dir))
    killed = start_long_run(
        tmp_path,
        corpus_dir,
        out,
        *extra,
        rows=rows,
        distinct_audio=True,
        ready=lambda _: list((cache_dir / "entries").glob("*.keys")),
    )
    assert killed.poll() is None, "the run finished before it could be killed: give it more rows"
    # kill -9 of every process of the run (the command's group and the job process's group, workers
    # included), as the out-of-memory killer or a scheduler's cgroup kill does: no clean-up runs
    pids = [killed.pid, *descendants(killed.pid)]
    groups = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    killed.communicate(timeout=60)
    deadline = time.time() + 60
    while any(running(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not (out / "schema.json").exists() and not list(out.glob("*.tfrecord"))  # nothing looks finished
    kept = cached_keys(cache_dir)
    assert 0 < len(kept) < rows

    corpus = tmp_path / "long.jsonl"
    # the rerun: in this process, one worker (what it finds in the cache does not depend on the worker count)
    assert run(preprocess_command(corpus, out, "--workers", "1", "--cache", str(cache_dir))[4:]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["counts"]["input_rows"] == rows and audio_rejections(stats) == 0  # every row needed its audio
    assert stats["cache"]["hits"] == len(set(kept)) > 0
    assert stats["cache"]["computed"] == rows - stats["cache"]["hits"]
    after = cached_keys(cache_dir)
    assert len(after) == len(set(after)) == rows  # no clip computed twice
    assert not list(out.glob(f"{staging.STAGE_PREFIX}*"))  # the killed run's staging dir is gone
    # every row is the same clip and text: each record, served from what the killed run left or computed by the
    # rerun (both kinds are there: 0 < kept < rows), differs from every other in its id only; that a record read
    # from the cache is the one a run without a cache writes: the `warm` fixture's cold run
    assert len({without_id(raw) for raw in records(out).values()}) == 1


def test_a_clip_key_follows_the_file_size_and_time_even_with_glob_characters_in_its_path(tmp_path):
    wav = tmp_path / "take[1]*.wav"  # a glob would match nothing, or another file
    wav.write_bytes(b"x" * 10)
    (tmp_path / "take1x.wav").write_bytes(b"y" * 10)
    key = cache.clip_key(str(wav), "s")
    assert key is not None and key == cache.clip_key(str(wav), "s") and key != cache.clip_key(str(wav), "t")
    os.utime(wav, (1_000_000, 1_000_000))
    assert cache.clip_key(str(wav), "s") != key
    assert cache.clip_key(str(tmp_path / "missing.wav"), "s") is None


def test_an_upgrade_of_a_library_is_a_new_key_for_the_parts_it_computes_and_only_those(monkeypatch):
    from melshards.preprocess.config import load_config

    plain = load_config(str(TINY_CONFIG), None, None)
    every = _with(plain, features={"energy": True, "pitch": True}, quality={"loudness": True, "dnsmos": True})
    configs = {
        "plain": plain,  # mel, measures
        "every": every,  # mel, energy, pitch (dio), measures, loudness, dnsmos
        "pyin": _with(plain, features={"pitch": True}, pitch={"tracker": "pyin"}),
        "normalised": _with(plain, audio={"loudness_target_lufs": -23.0}),
        "vad": _with(plain, audio={"trim_method": "webrtcvad"}),
    }
    before = {n: _settings(c) for n, c in configs.items()}
    real = importlib.metadata.version
    everything = {(n, p) for n, parts in before.items() for p in parts}
    for dist, changes in (
        ("librosa", everything),
        ("soxr", everything),
        ("numpy", everything),
        ("soundfile", everything),
        (
            "scipy",
            {(n, p) for n, p in everything if p in ("mel", "energy", "measures", "loudness")} | {("pyin", "pitch")},
        ),
        ("pyworld-prebuilt", {("every", "pitch")}),
        ("numba", {("pyin", "pitch")}),
        ("pyloudnorm", {("every", "loudness"), ("normalised", "mel")}),
        ("speechmos", {("every", "dnsmos")}),
        ("onnxruntime", {("every", "dnsmos")}),
        ("webrtcvad-wheels", {("vad", "mel"), ("vad", "measures")}),
    ):
        monkeypatch.setattr(importlib.metadata, "version", lambda d, dist=dist: "99.0" if d == dist else real(d))
        after = {n: _settings(c) for n, c in configs.items()}
        assert {(n, p) for n, parts in before.items() for p in parts if after[n][p] != parts[p]} == changes, dist
    monkeypatch.setattr(importlib.metadata, "version", real)
    assert {n: _settings(c) for n, c in configs.items()} == before


def test_one_file_spelt_another_way_or_from_another_directory_is_one_key(tmp_path, monkeypatch):
    wavs = tmp_path / "corpus" / "wavs"
    wavs.mkdir(parents=True)
    (wavs / "a.wav").write_bytes(b"x" * 10)
    (tmp_path / "link").symlink_to(tmp_path / "corpus")
    (wavs / "b.wav").symlink_to(wavs / "a.wav")
    key = cache.clip_key(str(wavs / "a.wav"), "s")
    monkeypatch.chdir(tmp_path)
    spellings = ["corpus/wavs/a.wav", "./corpus//wavs/../wavs/a.wav", "link/wavs/a.wav", str(wavs / "b.wav")]
    assert [cache.clip_key(p, "s") for p in spellings] == [key] * len(spellings)
    monkeypatch.chdir(wavs)
    assert cache.clip_key("a.wav", "s") == key
    (tmp_path / "other.wav").write_bytes(b"x" * 10)
    os.utime(tmp_path / "other.wav", ns=((wavs / "a.wav").stat().st_atime_ns, (wavs / "a.wav").stat().st_mtime_ns))
    assert cache.clip_key(str(tmp_path / "other.wav"), "s") != key  # another file of the same size and time
