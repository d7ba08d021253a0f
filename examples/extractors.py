"""Tiny per-clip extractors for `extractors:` in the preprocess config (docs/preprocess.md, Extractors),
built from code so the tests and the benchmark need no download: stand-ins for a speaker-embedding
ONNX model and a codec SavedModel, and a plain Python extractor.

    python -m examples.extractors out/extractors     # writes embedding.onnx and codec/ (a SavedModel)

then `configs/extractors.yaml` names them through the two adapters of `melshards.extractors`
(`onnx_model`, `saved_model`). Their numbers mean nothing; their shapes are those of the real kinds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

EMBEDDING_DIM = 4
CODEC_RATE = 16000  # Hz the codec reads
CODEC_HOP = 320  # samples per token: 50 tokens per second
CODEC_FRAME_RATE = CODEC_RATE / CODEC_HOP


def embedding_weights(dim: int = EMBEDDING_DIM) -> np.ndarray:
    """The embedding's fixed projection [4 statistics, dim]."""
    return (np.arange(4 * dim, dtype=np.float32).reshape(4, dim) % 5 - 2) / 2


def build_onnx_embedding(path: str | Path, dim: int = EMBEDDING_DIM) -> Path:
    """An ONNX model `audio` [1, samples] float32 -> `speaker_embedding` [1, dim]: four statistics of the
    clip (mean |x|, mean x^2, max, min) times `embedding_weights`. Built with onnx's helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(embedding_weights(dim), "weights")
    nodes = [
        helper.make_node("Abs", ["audio"], ["abs"]),
        helper.make_node("Mul", ["audio", "audio"], ["square"]),
        helper.make_node("ReduceMean", ["abs"], ["s0"], axes=[1], keepdims=1),
        helper.make_node("ReduceMean", ["square"], ["s1"], axes=[1], keepdims=1),
        helper.make_node("ReduceMax", ["audio"], ["s2"], axes=[1], keepdims=1),
        helper.make_node("ReduceMin", ["audio"], ["s3"], axes=[1], keepdims=1),
        helper.make_node("Concat", ["s0", "s1", "s2", "s3"], ["stats"], axis=1),
        helper.make_node("MatMul", ["stats", "weights"], ["speaker_embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_speaker_embedding",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, None])],
        [helper.make_tensor_value_info("speaker_embedding", TensorProto.FLOAT, [1, dim])],
        initializer=[weights],
    )
    # opset 17: ReduceMean/Max/Min take `axes` as an attribute up to opset 17
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by onnxruntime releases from 1.14 on
    onnx.checker.check_model(model)
    path = Path(path)
    path.write_bytes(model.SerializeToString())
    return path


def build_saved_model_codec(path: str | Path) -> Path:
    """A TensorFlow SavedModel whose serving signature takes `audio` [1, samples] float32 (16 kHz) and
    returns `codes` [1, samples // 320] int32: each 320-sample frame's RMS quantised to 0..255 (a
    codec's token stream at 50 per second, tail dropped)."""
    import tensorflow as tf

    class Codec(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, None], tf.float32, name="audio")])
        def encode(self, audio):
            frames = tf.shape(audio)[1] // CODEC_HOP
            x = tf.reshape(audio[:, : frames * CODEC_HOP], [1, frames, CODEC_HOP])
            rms = tf.sqrt(tf.reduce_mean(tf.square(x), axis=-1))
            return {"codes": tf.cast(tf.minimum(tf.floor(rms * 1024.0), 255.0), tf.int32)}

    module = Codec()
    path = Path(path)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.encode})
    return path


class RmsCodes:
    """A plain Python codec stand-in (`examples.extractors:rms_codes`): what `build_saved_model_codec`'s
    model computes, in numpy: `codes` [samples // 320] int16 at 16 kHz (`tokens` kind, 50 per second)."""

    name = "rms_codes"
    version = "1"
    sample_rate = CODEC_RATE
    outputs = ({"name": "codes", "kind": "tokens", "dtype": "int16", "frame_rate": CODEC_FRAME_RATE},)

    def __call__(self, clips):
        out = []
        for y in clips:
            frames = y.size // CODEC_HOP
            x = np.asarray(y[: frames * CODEC_HOP], np.float32).reshape(frames, CODEC_HOP)
            rms = np.sqrt(np.mean(np.square(x), axis=-1))
            out.append({"codes": np.minimum(np.floor(rms * 1024.0), 255.0).astype(np.int32)})
        return out


def rms_codes() -> RmsCodes:
    return RmsCodes()


class FrameLoudness:
    """A plain Python extractor (`examples.extractors:frame_loudness`): per mel frame, the mean |x| of
    the `hop` samples it centres on (`frames` kind); it raises on clips longer than `fail_above_s`
    seconds, when given (to show a failing clip rejected, not the job)."""

    name = "frame_loudness"
    version = "1"
    outputs = ({"name": "loudness", "kind": "frames", "dtype": "float32"},)

    def __init__(self, sample_rate: int = 22050, hop: int = 256, fail_above_s: float | None = None):
        self.sample_rate, self.hop, self.fail_above = sample_rate, hop, fail_above_s

    def one(self, y: np.ndarray) -> dict[str, np.ndarray]:
        if self.fail_above is not None and y.size > self.fail_above * self.sample_rate:
            raise ValueError(f"clip of {y.size / self.sample_rate:.2f} s is longer than {self.fail_above} s")
        frames = 1 + y.size // self.hop  # librosa's centred frames, as the mel's
        padded = np.pad(np.abs(y), (self.hop // 2, frames * self.hop))
        return {"loudness": padded[: frames * self.hop].reshape(frames, self.hop).mean(axis=1)}

    def __call__(self, clips):
        return [self.one(y) for y in clips]


def frame_loudness(**options) -> FrameLoudness:
    return FrameLoudness(**options)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out/extractors")
    for target in (out / "embedding.onnx", out / "codec"):
        if target.exists():  # it may be a model of the user's: never written over
            sys.exit(f"{target} exists: remove it, or name another directory (python -m examples.extractors DIR)")
    out.mkdir(parents=True, exist_ok=True)
    print(build_onnx_embedding(out / "embedding.onnx"))
    print(build_saved_model_codec(out / "codec"))
