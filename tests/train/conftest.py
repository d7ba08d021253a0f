"""Trainer fixtures: a tests-only tiny model config and small shard sets derived from `shards_dir`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_CONFIG, built_once

# Smaller than configs/train_tiny.yaml so each compile stays short on 2 shared cores.
TEST_CONFIG = {
    "data": {"batch_size": 4, "shuffle_buffer": 16, "cycle_length": 2},
    "model": {
        "d_model": 32,
        "num_heads": 2,
        "ff_dim": 64,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_conv_layers": 1,
        "prenet_dim": 32,
        "postnet_channels": 32,
        "postnet_layers": 1,
        "reduction_factor": 4,
        "dropout": 0.0,
        "prenet_dropout": 0.1,
    },
    "optim": {"learning_rate": 3.0e-3, "warmup_steps": 10},
    # Without XLA: the tests of the loop (resume, checkpoints, traces, plugins) check logic that does
    # not depend on the compiler, and skip a compile per Trainer build. The tests of what XLA does ask
    # for `"jit_compile": True`: the one-device and mirrored runs of test_distribute.py (the persistent
    # cache on a resumed run; under a strategy each replica's pass is compiled on its own,
    # train/distribute.py).
    "loop": {"steps": 20, "checkpoint_every": 10, "log_every": 5, "val_every": 10, "jit_compile": False},
}


def made(summary: dict, kind: str = "train") -> list[int]:
    """Per bucket of a run summary: how many times its `kind` step was traced or restored untraced from the
    persistent cache (train/programs.py; the tests share one cache, so a run may restore what another saved).
    One per bucket used is the one-trace-per-shape guarantee."""
    return [b[f"{kind}_step_traces"] + b[f"{kind}_step_restored"] for b in summary["buckets"]]


def write_config(path: Path, base: dict = TEST_CONFIG, **sections) -> Path:
    """`base` (TEST_CONFIG) with per-section overrides, e.g. write_config(p, loop={"steps": 40})."""
    cfg = {k: dict(v) for k, v in base.items()}
    for section, values in sections.items():
        cfg[section].update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


# A plug-in model (examples/fastspeech_lite.py) whose steps trace in about a quarter of the built-in model's
# time, for the tests of what the loop around a model does whatever the model (a NaN loss stops it, a resume
# restores and restarts the input, synthetic data, a corrupt shard): the built-in model is trained by
# test_training.py's overfit run, test_precision.py and the bucketed run.
LITE_MODEL = {"factory": "examples.fastspeech_lite:build", "d_model": 16, "encoder_layers": 1, "decoder_layers": 1}


def write_lite_config(path: Path, **sections) -> Path:
    """`write_config` with LITE_MODEL as the whole model section."""
    return write_config(path, dict(TEST_CONFIG, model=LITE_MODEL), **sections)


@pytest.fixture(scope="session")
def test_config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("cfg") / "train_test.yaml")


def write_records(src: Path, dst_dir: Path, n: int, transform=None) -> Path:
    """A shard set of the first n train records of src (same schema.json), optionally transformed."""
    import tensorflow as tf

    dst_dir.mkdir(parents=True)
    shutil.copy(src / "schema.json", dst_dir / "schema.json")
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(next(src.glob("train-*.tfrecord")))).take(n)]
    if transform is not None:
        records = [transform(r) for r in records]
    with tf.io.TFRecordWriter(str(dst_dir / "train-00000-of-00001.tfrecord")) as w:
        for r in records:
            w.write(r)
    return dst_dir


@pytest.fixture(scope="session")
def four_records(shards_dir, tmp_path_factory) -> Path:
    return write_records(shards_dir, tmp_path_factory.mktemp("four") / "shards", 4)


# The merged run's tables, in id order (names and codes sorted): anna reads English (the `english`
# front end), bert German (`characters`, the default for every language but en).
SPEAKERS, LANGUAGES = ("anna", "bert"), ("de", "en")


def two_speaker_run(corpus_dir: Path, tmp: Path, buckets: int) -> Path:
    """`tmp/shards`: a merged multilingual run, as `melshards preprocess` makes it from two inputs: a
    manifest of anna in English (three of every four good clips of the shipped corpus) and one of bert in
    German (the fourth), over the shipped audio, in `buckets` length buckets of at least 4 training records
    (TEST_CONFIG's batch; 16 in all). Speakers of very different sizes, so balancing by speaker drops records."""
    import csv

    from melshards.commands.preprocess import run

    texts = [line.split("|") for line in (corpus_dir / "metadata.csv").read_text().splitlines()]
    wavs = {p.stem: p for p in (corpus_dir / "wavs").glob("*.wav")}
    rows = [(fields[0], fields[-1]) for fields in texts if len(fields) == 3 and fields[0] in wavs]
    for name, language, keep in (("anna", "en", lambda i: i % 4 != 3), ("bert", "de", lambda i: i % 4 == 3)):
        with (tmp / f"{name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["audio", "text", "id", "speaker", "language"])
            w.writerows(
                [str(wavs[clip]), text, f"{name}-{clip}", name, language]
                for i, (clip, text) in enumerate(rows)
                if keep(i)
            )
    cfg = yaml.safe_load(TINY_CONFIG.read_text())
    cfg["pad"]["min_bucket_records"] = TEST_CONFIG["data"]["batch_size"]
    (tmp / "preprocess.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp / "shards"
    inputs = ["--input", str(tmp / "anna.csv"), "--input", str(tmp / "bert.csv")]
    code = run(
        [
            *inputs,
            "--output",
            str(out),
            "--config",
            str(tmp / "preprocess.yaml"),
            "--workers",
            "1",
            "--buckets",
            str(buckets),
        ]
    )
    assert code == 0, f"preprocess exited with {code}"
    return out


@pytest.fixture(scope="session")
def two_speakers_dir(corpus_dir, tmp_path_factory) -> Path:
    """`two_speaker_run` in one bucket, as shards_dir. Built once per session, shared by the xdist workers
    (`built_once`). Read-only for tests."""
    return built_once(tmp_path_factory, "two_speakers", lambda tmp: two_speaker_run(corpus_dir, tmp, 1)) / "shards"


@pytest.fixture(scope="session")
def two_speakers_bucketed_dir(corpus_dir, tmp_path_factory) -> Path:
    """`two_speaker_run` in two length buckets. Built once per session (`built_once`). Read-only for tests."""
    return (
        built_once(tmp_path_factory, "two_speakers_bucketed", lambda tmp: two_speaker_run(corpus_dir, tmp, 2))
        / "shards"
    )


@pytest.fixture(scope="session")
def two_speaker_bucketed_run(two_speakers_bucketed_dir, tmp_path_factory) -> tuple[Path, dict]:
    """16 steps of the built-in model on `two_speakers_bucketed_dir` (two speakers, two languages, two length
    buckets, validation records in one), speakers drawn equally often, two steps per call, validating, through
    the CLI entry point: the run test_buckets.py and test_speakers.py read. Built once per session, shared by
    the xdist workers (`built_once`). Returns (model dir, run_summary.json). Read-only."""
    import json

    from melshards.commands.train import run

    def build(root: Path) -> None:
        cfg = write_config(
            root / "c.yaml",
            data={"balance": "speaker", "balance_alpha": 0.0},
            loop={"steps": 16, "steps_per_execution": 2, "checkpoint_every": 16, "val_every": 16, "log_every": 2},
        )
        shards = two_speakers_bucketed_dir
        args = [str(shards / "train-*.tfrecord"), "--val", str(shards / "val-*.tfrecord")]
        code = run([*args, "--model-dir", str(root / "model"), "--config", str(cfg)])
        assert code == 0, f"train exited with {code}"

    model_dir = built_once(tmp_path_factory, "two_speaker_bucketed_run", build) / "model"
    return model_dir, json.loads((model_dir / "run_summary.json").read_text())


# XLA's LLVM backend at -O0, and fused kernels from its elemental LLVM IR emitter instead of its MLIR fusion
# emitters: the test model's step compiles faster and the tests check behaviour, not speed. A loss can differ in
# its last float bit from a run without these flags (runs with the same flags agree). Read by XLA at its first
# compile in this process (and inherited by the subprocesses the tests start).
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")


def model_dir_from_weights(shards_dir: Path, model_dir: Path, stop_bias: float, seed: int = 1) -> dict:
    """A `melshards train` model dir whose checkpoint holds random (not initial) weights, without training.

    The checkpoint is laid out as training writes it (model, optimizer, step). The stop head's bias
    decides when synthesis stops: very negative runs to max_mel_frames, very positive stops at once.
    Returns {variable path: saved value} in model.variables order.
    """
    import dataclasses
    import json

    import numpy as np
    import tensorflow as tf

    from melshards.shards_schema import read_schema
    from melshards.train.checkpoints import CHECKPOINT_DIR
    from melshards.train.config import config_from_dict
    from melshards.train.model import build_text_to_mel
    from melshards.train.step import make_optimizer

    cfg = config_from_dict(TEST_CONFIG)
    schema = read_schema(str(shards_dir / "schema.json"))
    model = build_text_to_mel(cfg.model, schema, "float32")
    optimizer = make_optimizer(cfg.optim, "float32", model)
    rng = np.random.default_rng(seed)
    for v in model.variables:
        v.assign(rng.normal(0.0, 0.3, v.shape).astype(np.float32))
    # the mel's two output layers a third as large: the log-mel then stays within the corpus's range
    # (-10.7 to -0.8 for the speaking model, against -17.8 to 13.3), as a trained model's does; librosa's
    # mel inversion in `griffin_lim` took 6x longer on the larger values
    for v in [*model.mel_head.variables, *model.postnet_out.variables]:
        v.assign(v * 0.3)
    model.stop_head.bias.assign(np.full(model.stop_head.bias.shape, stop_bias, np.float32))
    model_dir.mkdir(parents=True)
    shutil.copy(shards_dir / "schema.json", model_dir / "schema.json")
    (model_dir / "train_config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=tf.Variable(10, dtype=tf.int64))
    tf.train.CheckpointManager(ckpt, str(model_dir / CHECKPOINT_DIR), max_to_keep=1).save(checkpoint_number=10)
    return {v.path: v.numpy() for v in model.variables}


SPOKEN_TEXT = "Printing, in the only sense."


@pytest.fixture(scope="session")
def speaking_model_dir(shards_dir, tmp_path_factory) -> Path:
    """`model_dir_from_weights` of `shards_dir` with a stop head that never fires (stop_bias -20: each mel
    is max_mel_frames long), seed 1: the model dir of every test that reads weights and needs no training
    (synthesis, export, checkpoints). Built once per session, shared by the xdist workers (`built_once`);
    `saved_weights(speaking_model_dir)` gives the values it saved. Read-only: change a copy (`shutil.copytree`)."""
    import json

    import numpy as np

    def build(root: Path) -> None:
        saved = model_dir_from_weights(shards_dir, root / "model", stop_bias=-20.0, seed=1)
        np.savez(root / "saved.npz", *saved.values())
        (root / "saved.json").write_text(json.dumps(list(saved)))

    return built_once(tmp_path_factory, "speaking_model", build) / "model"


def saved_weights(model_dir: Path) -> dict:
    """{variable path: saved value} in model.variables order, as `model_dir_from_weights` returned it when
    it wrote `speaking_model_dir`."""
    import json

    import numpy as np

    paths = json.loads((model_dir.parent / "saved.json").read_text())
    with np.load(model_dir.parent / "saved.npz") as values:
        return {p: values[f"arr_{i}"] for i, p in enumerate(paths)}


@pytest.fixture(scope="session")
def spoken(speaking_model_dir, tmp_path_factory) -> dict:
    """SPOKEN_TEXT synthesized from `speaking_model_dir` by `python -m melshards synthesize` in two fresh
    processes, to one -o path in directories that did not exist (`wav`), each started as a user's shell
    starts it (TensorFlow's own log level unset, no GPU asked for), with a persistent XLA cache of their own
    (`cache`, MELSHARDS_XLA_CACHE):
    - the first with --export (`export`); its WAV's bytes are kept as `first`, and `cached` lists the
      cache's entries after it;
    - the second writing over that WAV (`second`: its exit code and stderr; `inodes`: the WAV's before and
      after it), XLA dumping whatever it compiles into `dumped` (`--xla_dump_to`; the files' names), and
      `cached_after` listing the cache after it.
    Built once per session, shared by the xdist workers (`built_once`); read only by
    test_synthesize_cli.py, so one worker builds and reads it."""
    import json
    import subprocess
    import sys

    def build(root: Path) -> None:
        wav, cache, dump = root / "new" / "deeper" / "out.wav", root / "xla", root / "dump"
        args = ["--model-dir", str(speaking_model_dir), SPOKEN_TEXT, "-o", str(wav), "--griffin-lim-iters", "2"]
        # as a user's shell starts it (log level and GPU unset), without the session's cache (TF_XLA_FLAGS)
        unset = ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "TF_XLA_FLAGS")
        env = {k: v for k, v in os.environ.items() if k not in unset}
        env["MELSHARDS_XLA_CACHE"] = str(cache)

        def listing(d: Path) -> list[str]:
            return sorted(p.name for p in d.iterdir()) if d.exists() else []

        def synthesize(*extra: str, **more_env: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "melshards", "synthesize", *args, *extra]
            return subprocess.run(cmd, capture_output=True, text=True, env=dict(env, **more_env), timeout=600)

        first = synthesize("--export", str(root / "export"))
        assert first.returncode == 0, first.stderr[-3000:]
        shutil.copy(wav, root / "first.wav")
        before, cached = wav.stat().st_ino, listing(cache)
        flags = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        done = synthesize(XLA_FLAGS=flags)
        facts = {
            "second": {"returncode": done.returncode, "stderr": done.stderr},
            "inodes": [before, wav.stat().st_ino if wav.exists() else None],
            "cached": cached,
            "cached_after": listing(cache),
            "dumped": listing(dump),
        }
        (root / "second.json").write_text(json.dumps(facts))

    root = built_once(tmp_path_factory, "spoken", build)
    facts = json.loads((root / "second.json").read_text())
    return {
        "wav": root / "new" / "deeper" / "out.wav",
        "export": root / "export",
        "first": root / "first.wav",
        **facts,
    }


def ids_in(files) -> list[bytes]:
    """The clip id of every record in the files, read straight from the TFRecords."""
    import tensorflow as tf

    spec = {"id": tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(raw, spec)["id"].numpy() for raw in tf.data.TFRecordDataset(list(files))]


def real_ids(batches) -> list[bytes]:
    """The ids of a pipeline's real records (mel_len > 0), in the order it gave them; padding left out."""
    import tensorflow as tf

    ids = tf.concat([b["id"] for b in batches], 0).numpy()
    return ids[tf.concat([b["mel_len"] for b in batches], 0).numpy() > 0].tolist()
