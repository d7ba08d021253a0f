"""Preprocessing fixtures: small audio files in the formats libsndfile reads, made from a numpy tone;
a real `melshards preprocess` long enough to interrupt."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.conftest import TINY_CONFIG, quality_rules_off


def beam_pipeline():
    """A Beam pipeline on the in-process runner, built as the job builds its own (a plain Pipeline on
    FnApiRunner; the default DirectRunner would first try to download Prism): the tests of single transforms
    run in it with `assert_that`. Not TestPipeline, which first round-trips each pipeline through its runner
    API proto and back (about half of a small pipeline's CPU), which FnApiRunner then does again to run it."""
    import apache_beam as beam

    return beam.Pipeline(runner="FnApiRunner")


# Bytes after the 4-byte frame header where the Xing/Info tag sits: MPEG-2 mono (libsndfile's MP3
# writer at 22.05 or 16 kHz), MPEG-2 stereo / MPEG-1 mono, MPEG-1 stereo.
_TAG_OFFSETS = (13, 21, 36)


def decoded_records(out_dir: Path, pattern: str = "*.tfrecord"):
    """(schema, every record of a run's shards matching `pattern`, each decoded as a batch of one by the
    schema's codec), the files in name order."""
    import tensorflow as tf  # here, not at the top: collecting the tests does not import TensorFlow

    from melshards.shards_schema import read_schema
    from melshards.shards_schema.records import decode_parsed, parse_spec

    schema = read_schema(str(out_dir))
    ds = tf.data.TFRecordDataset(sorted(str(p) for p in out_dir.glob(pattern))).batch(1)
    return schema, [decode_parsed(schema, tf.io.parse_example(b, parse_spec(schema)), 1) for b in ds]


def tone(seconds: float, sr: int = 22050, hz: float = 220.0, lead_silence_s: float = 0.0) -> np.ndarray:
    """A 0.5-amplitude sine, after `lead_silence_s` of digital silence."""
    t = np.arange(int(seconds * sr)) / sr
    y = 0.5 * np.sin(2 * np.pi * hz * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    return np.concatenate([np.zeros(int(lead_silence_s * sr)), y]).astype(np.float32)


def encode(y: np.ndarray, sr: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, sr, format=fmt)
    return buf.getvalue()


def mpeg2_layer3_frame_length(header: bytes) -> int:
    """Bytes in one MPEG-2 Layer III frame (the kind libsndfile writes at 22.05/16 kHz)."""
    assert header[0] == 0xFF and (header[1] >> 3) & 3 == 2 and (header[1] >> 1) & 3 == 1, header[:2].hex()
    kbps = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[header[2] >> 4]
    sr = (22050, 24000, 16000)[(header[2] >> 2) & 3]
    return 72000 * kbps // sr + ((header[2] >> 1) & 1)


def mp3_without_length_tag(y: np.ndarray, sr: int = 22050) -> bytes:
    """An MP3 with no Xing/Info header, as many encoders and stream rips write it.

    libsndfile's writer puts the length in a Xing tag in the first frame; dropping that frame leaves
    mpg123 to estimate the length from the bitrate of the first audio frame. After leading silence
    (a low-bitrate frame) the estimate is several times the real length.
    """
    data = encode(y, sr, "MP3")
    assert any(data[o : o + 4] in (b"Xing", b"Info") for o in _TAG_OFFSETS), "expected a Xing tag to strip"
    return data[mpeg2_layer3_frame_length(data[:4]) :]


class CallLog:
    """A list a spy in the job appends to: a file, since `melshards preprocess` runs its job in a forked
    job process (`run_in_job_process`), whose memory the test does not see."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, item) -> None:
        with open(self.path, "ab") as f:
            f.write(pickle.dumps(item))

    def items(self) -> list:
        found = []
        if self.path.exists():
            with open(self.path, "rb") as f:
                while f.peek(1):
                    found.append(pickle.load(f))
        return found

    def __len__(self) -> int:
        return len(self.items())

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def running(pid: int) -> bool:
    """A process that runs (not a zombie): Linux /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Process ids below pid, zombies left out (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rpartition(")")[2].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parents.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT as a terminal's process has it, whatever the test runner's
    worker inherited (an ignored SIGINT stays ignored across exec, and StopOnCtrlC then stands aside)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def long_corpus(tmp_path: Path, corpus_dir: Path, rows: int, distinct_audio: bool = False) -> Path:
    """A manifest repeating one clip of the shipped corpus: long enough to interrupt. With
    `distinct_audio`, each row's audio is a path of its own (hard links to one copy of the clip), so
    the feature cache keys every row apart."""
    wav = next(p for p in sorted((corpus_dir / "wavs").glob("*.wav")))
    paths = [wav] * rows
    if distinct_audio:
        links = tmp_path / "long-wavs"
        links.mkdir()
        shutil.copyfile(wav, links / "source.wav")
        paths = [links / f"r{i:05d}.wav" for i in range(rows)]
        for path in paths:
            os.link(links / "source.wav", path)
    text = "The quick brown fox jumps over the lazy dog."
    lines = [
        json.dumps({"id": f"r{i:05d}", "audio": str(path), "text": text, "language": "en"})
        for i, path in enumerate(paths)
    ]
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def preprocess_command(corpus: Path, out: Path, *extra) -> list[str]:
    """`melshards preprocess` of `corpus` into `out` with the demo config, as a command line."""
    return [
        sys.executable,
        "-m",
        "melshards",
        "preprocess",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--config",
        str(quality_rules_off(out.parent, TINY_CONFIG)),  # one recording repeated: duplicates by design
        *extra,
    ]


def beam_worker_pids(root: int) -> list[int]:
    """The pids of Beam's local worker processes (`python -m apache_beam.runners.worker.sdk_worker_main`)
    below `root` (Linux /proc)."""

    def cmdline(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return []

    return [
        pid
        for pid in descendants(root)
        if b"apache_beam.runners.worker.sdk_worker_main" in cmdline(pid)
        and os.path.basename(cmdline(pid)[0]).startswith(b"python")
    ]


def workers_started(p: subprocess.Popen) -> bool:
    """Both worker processes of a `--workers 2` run are started: the run holds its lock and staging dir
    and its workers are there to be stopped. (They are still loading their libraries: the first batch
    measured, `start_long_run`'s default, comes several seconds later.)"""
    return len(beam_worker_pids(p.pid)) >= 2


def start_long_run(tmp_path, corpus_dir, out, *extra, rows=20000, distinct_audio=False, ready=None):
    """A real `melshards preprocess` of `rows` rows (long enough to interrupt) in its own process group,
    returned once `ready(process)` is true; by default once its workers report progress (the worker
    processes measure clips)."""
    from melshards.preprocess.out_dir import staging

    if ready is None:

        def ready(_):
            return list(out.glob(f"{staging.STAGE_PREFIX}*/.melshards-tmp/progress-*.txt"))

    cmd = preprocess_command(long_corpus(tmp_path, corpus_dir, rows, distinct_audio), out, *extra)
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    deadline = time.time() + 600
    while not ready(p) and time.time() < deadline:
        assert p.poll() is None, p.communicate()
        time.sleep(0.02)
    return p
