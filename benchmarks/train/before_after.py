"""Against the loader melshards replaces: the same model, corpus and batch, four input/step variants.

  before        per-clip audio decode + librosa log-mel inside tf.numpy_function, padded_batch with
                None shapes, a tf.function step without input_signature (no XLA). The model is
                fixed-shape, so the step pads each batch up to it in-graph; every new batch shape
                is still a new trace.
  fixed_nosig   melshards shards (fixed shapes, pure-TF parse), tf.function step without signature
  sig_noxla     melshards shards, step with the schema's input_signature, jit_compile=False
  melshards     melshards shards, melshards.train.step.make_train_step: signature + jit_compile=True

Each variant trains a freshly built model (same seed) for --steps steps; variants alternate per
round under the same load. Dropout is off in every variant (see run_variant). Reported: wall steps/s over all steps (trace/compile included: what a
user waits for), steady steps/s (first call excluded), examples/s, and the step's trace count.

Run: python -m benchmarks.train.before_after [--steps 40] [--rounds 2] [--config configs/train_tiny.yaml]
         [--variants before,fixed_nosig,sig_noxla,melshards]   (ratios are against the first)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit
from benchmarks.shards_fixture import CORPUS, REPO, demo_shards

VARIANTS = ("before", "fixed_nosig", "sig_noxla", "melshards")


def _kept_clips(shards: Path) -> list[tuple[str, str]]:
    """(audio path, raw transcript) of the clips the shards hold: the before loader gets the same clips."""
    import tensorflow as tf

    ids = set()
    for rec in tf.data.TFRecordDataset([str(p) for p in shards.glob("train-*.tfrecord")]):
        ex = tf.train.Example.FromString(rec.numpy())
        ids.add(ex.features.feature["id"].bytes_list.value[0].decode())
    audio = {p.stem: str(p) for p in (CORPUS / "wavs").iterdir()}
    clips = []
    for line in (CORPUS / "metadata.csv").read_text().splitlines():
        f = line.split("|")
        if f[0] in ids and len(f) >= 2:
            clips.append((audio[f[0]], f[2] if len(f) > 2 and f[2] else f[1]))
            ids.discard(f[0])  # first row of a repeated id, as the job keeps
    return sorted(clips)


def before_dataset(clips, batch_size: int, schema):
    """The classic loader: Python decode + mel per clip, then pad to the batch's own maximum. Text
    through the front end and vocabulary the shards record (the model's ids)."""
    import tensorflow as tf

    from melshards.preprocess.clip import audio
    from melshards.preprocess.config import PreprocessConfig
    from melshards.shards_schema import Vocabulary
    from melshards.shards_schema.text import normalizer_for

    cfg, vocab, sample_rate = PreprocessConfig(), Vocabulary(schema.vocabulary), schema.audio.sample_rate
    language = schema.languages[0]
    normalize = normalizer_for(language.text_frontend)

    def load(path, text):
        y, _ = audio.decode_audio(open(path.decode(), "rb").read(), sample_rate)
        mel = audio.log_mel(audio.trim(y, cfg.audio), sample_rate, cfg.mel)
        ids, _ = vocab.encode(normalize(text.decode(), language.code))
        return np.asarray(ids, np.int32), mel, np.int32(len(ids)), np.int32(len(mel))

    def py_load(path, text):
        ids, mel, tl, ml = tf.numpy_function(load, [path, text], [tf.int32, tf.float32, tf.int32, tf.int32])
        ids.set_shape([None]), mel.set_shape([None, cfg.mel.n_mels]), tl.set_shape([]), ml.set_shape([])
        # the corpus has one speaker and one language: id 0 of schema.json's tables
        return {
            "text_ids": ids,
            "mel": mel,
            "text_len": tl,
            "mel_len": ml,
            "speaker_id": tf.constant(0, tf.int32),
            "language_id": tf.constant(0, tf.int32),
        }

    paths, texts = zip(*clips)
    return (
        tf.data.Dataset.from_tensor_slices((list(paths), list(texts)))
        .shuffle(len(clips), seed=0)
        .repeat()
        .map(py_load, num_parallel_calls=tf.data.AUTOTUNE)
        .padded_batch(
            batch_size,
            padding_values={
                "text_ids": 0,
                "mel": float(np.log(cfg.mel.log_floor)),
                "text_len": 0,
                "mel_len": 0,
                "speaker_id": 0,
                "language_id": 0,
            },
            drop_remainder=True,
        )
        .prefetch(tf.data.AUTOTUNE)
    )


def plain_step(model, optimizer, schema, batch_size: int, signature: bool, pad_to_schema: bool):
    import tensorflow as tf

    from melshards.shards_schema.records import tensor_specs
    from melshards.train.step import MODEL_INPUTS

    key = tf.constant([0, 0], tf.int32)

    def step(batch):
        if pad_to_schema:  # the fixed-shape model needs its shapes; None-shaped batches are padded up
            t, m = schema.max_text_len, schema.max_mel_frames
            batch = dict(
                batch,
                text_ids=tf.ensure_shape(
                    tf.pad(batch["text_ids"], [[0, 0], [0, t - tf.shape(batch["text_ids"])[1]]]), [batch_size, t]
                ),
                mel=tf.ensure_shape(
                    tf.pad(
                        batch["mel"],
                        [[0, 0], [0, m - tf.shape(batch["mel"])[1]], [0, 0]],
                        constant_values=schema.mel.pad_value,
                    ),
                    [batch_size, m, schema.n_mels],
                ),
            )
        with tf.GradientTape() as tape:
            loss = model.losses_from_terms(model.loss_terms(batch, key, training=True))["loss"]
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 1.0)  # as the step does
        optimizer.apply(grads, model.trainable_variables)
        return {"loss": loss, "examples": tf.cast(tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.int32)), tf.float32)}

    sig = [tensor_specs(schema, batch_size, MODEL_INPUTS)] if signature else None
    return tf.function(step, input_signature=sig, jit_compile=False)


def run_variant(name: str, shards: Path, clips, config: str, steps: int) -> dict:
    import keras
    import tensorflow as tf

    from melshards.shards_schema import read_schema
    from melshards.train import input_pipeline
    from melshards.train.config import load_config
    from melshards.train.model import build_text_to_mel
    from melshards.train.step import MODEL_INPUTS, make_optimizer, make_train_step, step_specs

    cfg = load_config(config)
    # The model's threefry dropout has an XLA kernel only (on CPU); the non-XLA variants need it off,
    # so every variant trains the same model without dropout.
    cfg = dataclasses.replace(cfg, model=dict(cfg.model, dropout=0.0, prenet_dropout=0.0))
    schema = read_schema(str(shards))
    b = cfg.data.batch_size
    keras.utils.set_random_seed(0)
    model = build_text_to_mel(cfg.model, schema, "float32")
    opt = make_optimizer(cfg.optim, "float32", model)
    if name == "before":
        data, step = before_dataset(clips, b, schema), plain_step(model, opt, schema, b, False, True)
    else:
        files = input_pipeline.expand_globs([str(shards / "train-*.tfrecord")])
        data = input_pipeline.train_dataset(files, schema, cfg.data, MODEL_INPUTS, 1)
        if name == "melshards":
            step = make_train_step(
                model,
                opt,
                schema,
                cfg.optim,
                step_specs(schema, b),
                1,
                0,
                tf.Variable(0, dtype=tf.int64),
                ("loss", "mel_loss", "postnet_loss", "stop_loss"),
            )
        else:
            data = data.map(lambda d: {k: v[0] for k, v in d.items()})
            step = plain_step(model, opt, schema, b, signature=(name == "sig_noxla"), pad_to_schema=False)
    it = iter(data)
    times, waits, examples, frames = [], [], [], []
    t_start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(it)
        waits.append(time.perf_counter() - t)
        out = step(batch)
        examples.append(float(out["examples"]))
        frames.append(float(tf.reduce_sum(batch["mel_len"])))  # valid mel frames (padding records count 0)
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - t_start
    steady = sum(times[1:])
    return {
        "wall_steps_per_s": steps / wall,
        "steady_steps_per_s": (steps - 1) / steady,
        "examples_per_s": sum(examples) / wall,
        "first_call_s": times[0],
        "steady_examples_per_s": sum(examples[1:]) / steady,
        "steady_mel_frames_per_s": sum(frames[1:]) / steady,
        "input_wait": sum(waits[1:]) / steady,
        "traces": step.experimental_get_tracing_count(),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", default=str(REPO / "configs" / "train_tiny.yaml"))
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset; ratios are against the first one given"
    )
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "melshards-bench" / "before-after"))
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    shards = demo_shards(str(Path(args.work) / "shards"))
    clips = _kept_clips(shards)
    res = {v: [] for v in variants}
    base = variants[0]
    for r in range(args.rounds):
        for v in variants:
            out = run_variant(v, shards, clips, args.config, args.steps)
            res[v].append(out)
            print(
                f"round {r + 1} {v:<12} wall {out['wall_steps_per_s']:6.2f} steps/s  steady "
                f"{out['steady_steps_per_s']:6.2f} steps/s  {out['examples_per_s']:7.1f} examples/s  "
                f"first call {out['first_call_s']:5.1f}s  traces {out['traces']}",
                flush=True,
            )
    med = {v: {k: round(statistics.median(o[k] for o in res[v]), 3) for k in res[v][0]} for v in variants}

    def ratio(key, v):
        return round(statistics.median(a[key] / b[key] for a, b in zip(res[v], res[base])), 2)

    from melshards.train.config import load_config

    result = {
        "benchmark": "before_after",
        "steps": args.steps,
        "rounds": args.rounds,
        "batch_size": load_config(args.config).data.batch_size,
        "median": med,
        "baseline": base,
        "wall_speedup": {v: ratio("wall_steps_per_s", v) for v in variants},
        "steady_speedup": {v: ratio("steady_steps_per_s", v) for v in variants},
    }
    print(
        f"{'variant':<12} {'wall st/s':>9} {'steady st/s':>11} {'ex/s':>7} {'traces':>6} {'wall x':>7} {'steady x':>8}"
    )
    for v in variants:
        m = med[v]
        print(
            f"{v:<12} {m['wall_steps_per_s']:>9.2f} {m['steady_steps_per_s']:>11.2f} {m['examples_per_s']:>7.1f} "
            f"{m['traces']:>6.0f} {result['wall_speedup'][v]:>7.2f} {result['steady_speedup'][v]:>8.2f}"
        )
    emit(result)
    return result


if __name__ == "__main__":
    main()
