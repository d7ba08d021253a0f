"""Which record encoding parses fastest in tf.data? Decides shards_schema's storage choice.

Same real log-mels (the shipped corpus, padded like the job pads them) stored four ways, parsed by
the same batched tf.data chain, timed interleaved:
  raw_f16      mel as float16 bytes + decode_raw (what melshards writes)
  raw_f32      mel as float32 bytes + decode_raw
  floatlist    mel as a FloatList (tf.train.Feature float_list)
  raw_f16_gzip raw_f16 in a GZIP-compressed TFRecord file

Run: python -m benchmarks.train.record_encoding [--records 2048] [--frames 800] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import emit, interleaved, median_ratio

CORPUS = Path(__file__).resolve().parents[2] / "data" / "ljspeech_tiny"


def corpus_mels(frames: int) -> list[np.ndarray]:
    from melshards.preprocess.clip import audio
    from melshards.preprocess.config import PreprocessConfig

    cfg = PreprocessConfig()
    mels = []
    for p in sorted((CORPUS / "wavs").glob("LJT00[12]-*")):
        y, _ = audio.decode_audio(p.read_bytes(), cfg.audio.sample_rate)
        m = audio.log_mel(audio.trim(y, cfg.audio), cfg.audio.sample_rate, cfg.mel)[:frames]
        mels.append(np.pad(m, [(0, frames - len(m)), (0, 0)], constant_values=np.log(cfg.mel.log_floor)))
    return mels


def write(path: str, mels: list[np.ndarray], n: int, kind: str) -> None:
    import tensorflow as tf

    opts = tf.io.TFRecordOptions(compression_type="GZIP" if kind.endswith("gzip") else "")
    with tf.io.TFRecordWriter(path, opts) as w:
        for i in range(n):
            m = mels[i % len(mels)]
            if kind == "floatlist":
                f = tf.train.Feature(float_list=tf.train.FloatList(value=m.ravel()))
            else:
                dt = "<f4" if kind == "raw_f32" else "<f2"
                f = tf.train.Feature(bytes_list=tf.train.BytesList(value=[m.astype(dt).tobytes()]))
            lens = tf.train.Feature(int64_list=tf.train.Int64List(value=[len(m)]))
            w.write(
                tf.train.Example(features=tf.train.Features(feature={"mel": f, "mel_len": lens})).SerializeToString()
            )


def dataset(path: str, kind: str, frames: int, n_mels: int, batch: int):
    import tensorflow as tf

    if kind == "floatlist":
        spec = {"mel": tf.io.FixedLenFeature([frames * n_mels], tf.float32)}
    else:
        spec = {"mel": tf.io.FixedLenFeature([], tf.string)}
    spec["mel_len"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(b):
        p = tf.io.parse_example(b, spec)
        if kind == "floatlist":
            mel = p["mel"]
        else:
            mel = tf.cast(tf.io.decode_raw(p["mel"], tf.float32 if kind == "raw_f32" else tf.float16), tf.float32)
        return tf.reshape(mel, [batch, frames, n_mels]), p["mel_len"]

    return (
        tf.data.TFRecordDataset(path, compression_type="GZIP" if kind.endswith("gzip") else "")
        .batch(batch, drop_remainder=True)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2048)
    ap.add_argument("--frames", type=int, default=800)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    mels = corpus_mels(args.frames)
    kinds = ("raw_f16", "raw_f32", "floatlist", "raw_f16_gzip")
    with tempfile.TemporaryDirectory() as d:
        paths = {k: os.path.join(d, f"{k}.tfrecord") for k in kinds}
        for k in kinds:
            write(paths[k], mels, args.records, k)
        sizes = {k: os.path.getsize(paths[k]) for k in kinds}

        def reader(k):
            def go():
                n = 0
                for mel, _ in dataset(paths[k], k, args.frames, mels[0].shape[1], args.batch):
                    n += int(mel.shape[0])
                return n

            return go

        reader("raw_f16")()  # warm-up: first dataset build and TF kernels
        rates = interleaved({k: reader(k) for k in kinds}, args.rounds)
    result = {
        "benchmark": "record_encoding",
        "records": args.records,
        "frames": args.frames,
        "rounds": args.rounds,
        "records_per_s_median": {k: round(float(np.median(v)), 1) for k, v in rates.items()},
        "bytes_per_record": {k: sizes[k] // args.records for k in kinds},
        "speed_vs_raw_f16": {k: round(median_ratio(rates, k, "raw_f16"), 3) for k in kinds},
    }
    for k in kinds:
        print(
            f"{k:<14} {result['records_per_s_median'][k]:>10.1f} records/s  "
            f"{result['speed_vs_raw_f16'][k]:>6.3f}x raw_f16  {result['bytes_per_record'][k]:>8d} B/record"
        )
    emit(result)
    return result


if __name__ == "__main__":
    main()
