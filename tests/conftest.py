"""Shared fixtures: the shipped corpus, and one preprocessing run reused by every test package."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `melshards train` keeps compiled steps in a persistent XLA cache (train/xla_cache.py): the test session
# keeps them in one directory of its own, never in the user's ~/.cache, made by the process that starts
# the session (the xdist workers inherit it) and removed by it. It is put in TF_XLA_FLAGS here, before any
# test imports TensorFlow (which reads the flags once per process), so that the training runs inside the
# test processes, not only the `melshards train` subprocesses, share one compile of each step.
if "MELSHARDS_XLA_CACHE" not in os.environ:
    os.environ["MELSHARDS_XLA_CACHE"] = tempfile.mkdtemp(prefix="melshards-test-xla-")
    atexit.register(shutil.rmtree, os.environ["MELSHARDS_XLA_CACHE"], True)
if os.environ["MELSHARDS_XLA_CACHE"]:
    from melshards.train.xla_cache import enable_persistent_cache

    enable_persistent_cache(os.environ["MELSHARDS_XLA_CACHE"])

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "ljspeech_tiny"
TINY_CONFIG = REPO / "configs" / "ljspeech_tiny.yaml"
# Every quality rule off (docs/preprocess.md, Quality rules), for tests of other behaviour whose synthetic
# corpora trip them by design: a pure tone is narrowband, a corpus repeating one recording under new ids is
# duplicates, the demo speech dealt to made-up speakers moves the per-speaker speaking-rate bounds.
QUALITY_RULES_OFF = {
    "quality_rules": {
        "rate_iqr_k": None,
        "max_clipped_fraction": None,
        "min_bandwidth_share": None,
        "min_snr_db": None,
        "max_pause_s": None,
        "max_cer": None,
        "duplicates": False,
    }
}


def quality_rules_off(dest_dir: Path, base: Path | None = None, **sections) -> Path:
    """A config file in `dest_dir`: `base` (a config file) with `sections` and QUALITY_RULES_OFF over it."""
    import yaml

    cfg = yaml.safe_load(base.read_text()) if base else {}
    cfg.update(sections)
    cfg.update(QUALITY_RULES_OFF)
    path = Path(dest_dir) / "quality-rules-off.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


REFERENCE_CLIPS = [f"LJT001-{i:04d}" for i in range(1, 31)]  # clips of the shipped corpus that measure fine


# The files whose tests take longest (a compile, a training run or a process importing TensorFlow each), run
# first: `make test` runs the files in this order (pytest-xdist --dist loadfile --no-loadscope-reorder), so
# the last files a worker takes are short ones and neither worker waits long for the other at the end.
# xdist's own order (most tests first) put these few-test, long files last; test_import_name.py would be
# the second last file collected.
SLOW_FILES_FIRST = ("tests/train/", "tests/test_benchmarks.py", "tests/test_import_name.py")


def pytest_collection_modifyitems(config, items) -> None:
    """The tests of SLOW_FILES_FIRST first, each group in its collected order (a stable sort: the same in
    every xdist worker)."""
    items.sort(key=lambda item: not item.nodeid.startswith(SLOW_FILES_FIRST))


_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)  # the signals melshards installs handlers for


def signal_state() -> dict[str, object]:
    """This process's signal state: the Python handlers of SIGINT, SIGTERM and SIGCHLD, the main thread's
    blocked set, the wakeup fd, and the kernel's ignored and caught sets of every signal (/proc: a
    handler changed through ctypes, as train/signals.py does, shows there only). Main thread only; about
    0.2 ms (asking Python for the handler of every signal would take 0.8 ms more)."""
    fd = signal.set_wakeup_fd(-1)
    if fd != -1:
        signal.set_wakeup_fd(fd)
    with open("/proc/self/status") as f:
        kernel = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k in ("SigIgn", "SigCgt")}
    return {
        "handlers": {int(s): signal.getsignal(s) for s in _HANDLED},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "wakeup_fd": fd,
        **kernel,
    }


@pytest.fixture(autouse=True)
def signals_as_they_were():
    """Every test leaves the process's signal state as it found it (`signal_state`): the tests after it
    in the same process (an xdist worker runs many files) start from a command's usual state. A test that
    changes it fails, naming what changed, and the state is put back for the next one."""
    before = signal_state()
    yield
    after = signal_state()
    if after == before:
        return
    for signum, handler in before["handlers"].items():  # type: ignore[attr-defined]
        if handler is not None:  # None: a handler not installed from Python; nothing to put back
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, before["blocked"])  # type: ignore[arg-type]
    signal.set_wakeup_fd(before["wakeup_fd"])  # type: ignore[arg-type]
    changed = {k: (before[k], after[k]) for k in before if k != "handlers" and before[k] != after[k]}
    changed.update(
        {
            f"handler of signal {signum}": (handler, after["handlers"][signum])  # type: ignore[index]
            for signum, handler in before["handlers"].items()  # type: ignore[attr-defined]
            if after["handlers"][signum] != handler  # type: ignore[index]
        }
    )
    pytest.fail(f"the test left the process's signal state changed (before, after): {changed}")


@pytest.fixture(scope="session", autouse=True)
def librosa_imported() -> None:
    """librosa imported into the test process before its first test, as the job imports it
    (`load_librosa`). A preprocessing run in the test process (`melshards.commands.preprocess.run`) runs
    its job in a forked job process, which inherits what this process has imported; a process that has not
    imported librosa would import it again in each job process. Whichever test files are run: collecting
    tests/preprocess/test_audio.py imports it too, a run of other files would not."""
    from melshards.preprocess.clip.audio import load_librosa

    load_librosa()


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return CORPUS


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(dir)` run once per test session, its directory shared by every xdist worker: the first worker
    to take the lock builds `name`, the others wait for it and reuse it. A build that fails leaves no
    `.built` marker: the next worker to need it tries again (and reports its own failure).

    Under xdist every worker's base temp is `<session dir>/popen-gwN`, so the session dir (their parent)
    is shared and new each session; without xdist the base temp itself is the session's.
    """
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (path / ".built").exists():
            shutil.rmtree(path, ignore_errors=True)  # a failed build's leftovers
            path.mkdir()
            build(path)
            (path / ".built").touch()
    return path


def preprocess_demo_corpus(out: Path, *extra: str) -> None:
    """The shipped corpus preprocessed into `out` with the demo config (in-process runner)."""
    from melshards.commands.preprocess import run

    code = run(["--input", str(CORPUS), "--output", str(out), "--config", str(TINY_CONFIG), *extra])
    assert code == 0, f"preprocess exited with {code}"


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory) -> Path:
    """Shards, schema.json, stats.json and rejected.jsonl from the shipped corpus (in-process runner),
    in one length bucket (`--buckets 1`: the demo config's `auto` makes four, see `bucketed_dir`).
    Built once per session, shared by the xdist workers (`built_once`).

    Read-only for tests: copy it before changing anything.
    """
    return (
        built_once(
            tmp_path_factory,
            "shards",
            lambda out: preprocess_demo_corpus(out / "run", "--overwrite", "--workers", "1", "--buckets", "1"),
        )
        / "run"
    )


@pytest.fixture(scope="session")
def bucketed_dir(tmp_path_factory) -> Path:
    """The shipped corpus preprocessed into 4 length buckets (`--buckets 4`, what the demo config's
    `auto` gives: min_bucket_records 8 merges the rest). Built once per session, shared by the xdist
    workers (`built_once`). Read-only for tests."""
    return (
        built_once(tmp_path_factory, "bucketed", lambda out: preprocess_demo_corpus(out / "run", "--buckets", "4"))
        / "run"
    )


def write_textgrids(corpus: Path, dest: Path, skip=(), stretch: dict | None = None) -> list[str]:
    """Montreal Forced Aligner-like TextGrids (`write_textgrid`) for the clips of an LJSpeech-layout
    corpus, from each clip's normalised transcript and audio duration. No TextGrid for the ids in `skip`;
    `stretch` {id: seconds} moves a TextGrid's end away from the audio's. Returns the ids written.
    Unreadable audio gets none."""
    import soundfile as sf

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for line in (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines():
        clip_id, _, text = (line.split("|") + ["", ""])[:3]
        wavs = sorted((corpus / "wavs").glob(f"{clip_id}.*"))
        if clip_id in skip or not wavs:
            continue
        try:
            end = sf.info(str(wavs[0])).duration + (stretch or {}).get(clip_id, 0.0)
        except Exception:  # noqa: BLE001 (the corpus's broken files: the job rejects them)
            continue
        write_textgrid(dest / f"{clip_id}.TextGrid", text, end)
        written.append(clip_id)
    return written


def write_textgrid(path: Path, text: str, end: float) -> None:
    """A Montreal Forced Aligner-like TextGrid (tiers `words` and `phones`, long format) for a clip of
    `end` seconds: each word of `text` spread evenly over 5-95% of it, one phone per letter (upper
    case), silences as MFA writes them (gaps, and an `sp` between every third word)."""
    from praatio import textgrid

    words = [w for w in "".join(c if c.isalpha() else " " for c in text.lower()).split()] or ["a"]
    span, t = 0.9 * end / len(words), 0.05 * end
    word_entries, phone_entries = [], []
    for i, word in enumerate(words):
        start, stop = t, t + span
        speech_end = stop - (0.2 * span if i % 3 == 2 else 0.0)
        word_entries.append((start, speech_end, word))
        step = (speech_end - start) / len(word)
        ends = [start + (k + 1) * step for k in range(len(word) - 1)] + [speech_end]  # the word's end exactly
        phone_entries += [(start + k * step, ends[k], c.upper()) for k, c in enumerate(word)]
        if speech_end < stop:
            phone_entries.append((speech_end, stop, "sp"))
        t = stop
    tg = textgrid.Textgrid()
    tg.addTier(textgrid.IntervalTier("words", word_entries, 0, end))
    tg.addTier(textgrid.IntervalTier("phones", phone_entries, 0, end))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tg.save(str(path), format="long_textgrid", includeBlankSpaces=True)


FEATURES_CONFIG = """\
filter: {mel_frames_upper_percentile: 95.0, text_len_upper_percentile: 95.0}
pad: {min_bucket_records: 8}
split: {val_fraction: 0.1}
features: {pitch: true, energy: true, audio: true}
"""


@pytest.fixture(scope="session")
def features_dir(tmp_path_factory) -> Path:
    """The shipped corpus preprocessed with every optional feature: pitch, energy, audio, and phone
    durations from TextGrids (`write_textgrids`, in `features_dir.parent / "alignments"`), with the config
    `features_dir.parent / "features.yaml"` and a feature cache, which this run fills, in
    `features_dir.parent / "cache"` (a rerun from it: tests/preprocess/test_cache.py). Two clips have no
    TextGrid (missing_alignment) and one ends 0.5 s after its audio (alignment_mismatch). Built once per
    session, shared by the xdist workers (`built_once`). Read-only for tests: copy the cache to use it."""
    from melshards.commands.preprocess import run

    def build(root: Path) -> None:
        written = write_textgrids(CORPUS, root / "alignments", skip=MISSING_ALIGNMENTS, stretch={STRETCHED: 0.5})
        assert len(written) > 40
        (root / "features.yaml").write_text(FEATURES_CONFIG)
        code = run(
            [
                "--input",
                str(CORPUS),
                "--output",
                str(root / "run"),
                "--config",
                str(root / "features.yaml"),
                "--alignments",
                str(root / "alignments"),
                "--cache",
                str(root / "cache"),
                "--workers",
                "1",
            ]
        )
        assert code == 0, f"preprocess exited with {code}"

    return built_once(tmp_path_factory, "features", build) / "run"


MISSING_ALIGNMENTS = ("LJT001-0002", "LJT001-0005")
STRETCHED = "LJT001-0007"


@pytest.fixture(scope="session")
def reference_runs(corpus_dir, tmp_path_factory):
    """Speakers "anna" and "bert" with 10 clips each (3 in val), "cleo" with one (in train) and "dora" with
    two (one in each split), other_clip references of 40 frames, in two buckets; run twice over one
    feature cache (the second run reads every clip from it).
    Built once per session (`built_once`), shared by tests/preprocess and tests/train. Read-only."""
    import csv

    import yaml

    from melshards.commands.preprocess import run

    def build(tmp: Path) -> None:
        texts = dict(
            line.split("|")[:2]
            for line in (corpus_dir / "metadata.csv").read_text().splitlines()
            if line.count("|") == 2
        )
        wavs = {p.stem: p for p in (corpus_dir / "wavs").iterdir()}
        good = [c for c in REFERENCE_CLIPS if c in wavs and texts.get(c, "").strip()]  # 23
        speakers = ["cleo", "dora", "dora"] + ["bert", "anna"] * 10
        rows = [
            {"audio": str(wavs[c]), "text": texts[c], "id": c, "speaker": speaker}
            for c, speaker in zip(good, speakers, strict=True)
        ]
        manifest = tmp / "corpus.csv"
        with manifest.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        cfg = tmp / "cfg.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "filter": {"mel_frames_upper_percentile": 100.0, "text_len_upper_percentile": 100.0},
                    "split": {"val_fraction": 0.25},
                    "pad": {"buckets": 2},
                    "reference": {"source": "other_clip", "frames": 40, "min_seconds": 1.5, "seed": 3},
                    # every clip kept (ten clips make a speaker's own speaking-rate bounds)
                    "quality_rules": {"rate_iqr_k": None},
                }
            )
        )
        for name in ("first", "again"):
            out = tmp / name
            args = [
                "--input",
                str(manifest),
                "--output",
                str(out),
                "--config",
                str(cfg),
                "--cache",
                str(tmp / "cache"),
                "--language",
                "en",
            ]
            assert run([*args, "--workers", "1"]) == 0

    tmp = built_once(tmp_path_factory, "references", build)
    return list(csv.DictReader((tmp / "corpus.csv").open())), [tmp / "first", tmp / "again"]


@pytest.fixture(scope="module")
def gcs():
    """A GCS emulator for the test module (tests/gcs_emulator.py: fake-gcs-server behind a counting proxy),
    with its `environ` (`STORAGE_EMULATOR_HOST`, credentials and a project) set for this process and the
    processes it starts. Per module, not per session: the server is a child of the test process, and the
    tests that check a job leaves no process behind (test_workers) count this process's descendants."""
    from tests.gcs_emulator import running_emulator

    with running_emulator() as emulator:
        yield emulator
