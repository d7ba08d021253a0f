"""Extractor adapters (docs/preprocess.md, Extractors you plug in): a model file -> a per-clip extractor
for `extractors:` in the preprocess config (`melshards.preprocess.clip.extractor_plugins` says what one is).

- `melshards.extractors:onnx_model`: an ONNX model, run by onnxruntime;
- `melshards.extractors:saved_model`: a TensorFlow SavedModel (TensorFlow imported when one is loaded,
  in the worker that loads it: this module sits above the job, which imports no TensorFlow itself).

Each runs one clip per call, unpadded: an output never depends on which clips share its batch, so a
clip's outputs are the same in any run (the feature cache relies on it). Each one's fingerprint hashes
the model file's bytes, the declaration and `ADAPTER_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.shards_schema.extracted import ExtractorOutput

ADAPTER_VERSION = "1"  # of the adapters below: part of their fingerprint


def _outputs(name: str, declared: Sequence[Any]) -> tuple[ExtractorOutput, ...]:
    return tuple(o if isinstance(o, ExtractorOutput) else ExtractorOutput(**o) for o in declared)


def file_fingerprint(paths: Sequence[str], declaration: Any) -> str:
    """sha256 of the files' bytes (in the order given), the declaration and the adapter's version."""
    h = hashlib.sha256(f"adapter {ADAPTER_VERSION}\n{json.dumps(declaration, sort_keys=True)}\n".encode())
    for path in paths:
        with FileSystems.open(path) as f:
            h.update(f.read())
    return h.hexdigest()


class _ModelFile:
    """What both adapters share: the declaration, and one clip per model call."""

    name: str
    version: str
    sample_rate: int
    outputs: tuple[ExtractorOutput, ...]
    fingerprint: str

    def _init(self, name: str, version: str, sample_rate: int, outputs: Sequence[dict]) -> None:
        self.name, self.version, self.sample_rate = name, str(version), int(sample_rate)
        self.outputs = _outputs(name, outputs)

    def _declaration(self, kind: str) -> dict:
        return {"kind": kind, "sample_rate": self.sample_rate, "outputs": [o.to_dict() for o in self.outputs]}

    def one(self, y: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __call__(self, clips: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        return [self.one(np.asarray(y, np.float32)) for y in clips]


class OnnxExtractor(_ModelFile):
    """An ONNX model: input `[1, samples]` float32 (its first input, or `input_name`), outputs named as
    declared (the batch axis of size 1 is dropped)."""

    def __init__(
        self,
        path: str,
        name: str,
        outputs: Sequence[dict],
        sample_rate: int = 16000,
        version: str = "1",
        input_name: str | None = None,
        providers: Sequence[str] | None = None,
    ):
        import onnxruntime

        self._init(name, version, sample_rate, outputs)
        with FileSystems.open(path) as f:
            model = f.read()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one worker process per core (melshards.preprocess.workers)
        self.session = onnxruntime.InferenceSession(
            model, options, providers=list(providers or onnxruntime.get_available_providers())
        )
        self.input_name = input_name or self.session.get_inputs()[0].name
        self.fingerprint = file_fingerprint([path], self._declaration("onnx"))

    def one(self, y: np.ndarray) -> dict[str, np.ndarray]:
        names = [o.name for o in self.outputs]
        values = self.session.run(names, {self.input_name: y[None, :]})
        return {n: np.asarray(v)[0] for n, v in zip(names, values)}


def onnx_model(**options) -> OnnxExtractor:
    """Extractor factory for an ONNX file (`melshards.extractors:onnx_model`): options `path`
    (local or gs://), `name`, `outputs`, `sample_rate`, `version`, `input_name`, `providers`
    (onnxruntime's, e.g. [CUDAExecutionProvider, CPUExecutionProvider]; default: every available one)."""
    return OnnxExtractor(**options)


class SavedModelExtractor(_ModelFile):
    """A TensorFlow SavedModel directory: its `signature` (serving_default) takes `[1, samples]` float32
    and returns the declared outputs by name (the batch axis of size 1 is dropped)."""

    def __init__(
        self,
        path: str,
        name: str,
        outputs: Sequence[dict],
        sample_rate: int = 16000,
        version: str = "1",
        signature: str = "serving_default",
    ):
        import tensorflow as tf

        self._init(name, version, sample_rate, outputs)
        self.tf = tf
        self.fn = tf.saved_model.load(path).signatures[signature]
        files = sorted(FileSystems.join(root, n) for root, _, names in tf.io.gfile.walk(path) for n in names)
        self.fingerprint = file_fingerprint(files, self._declaration("saved_model"))

    def one(self, y: np.ndarray) -> dict[str, np.ndarray]:
        (arg,) = self.fn.structured_input_signature[1].keys()
        out = self.fn(**{arg: self.tf.constant(y[None, :])})
        return {o.name: out[o.name].numpy()[0] for o in self.outputs}


def saved_model(**options) -> SavedModelExtractor:
    """Extractor factory for a TensorFlow SavedModel (`melshards.extractors:saved_model`):
    options `path`, `name`, `outputs`, `sample_rate`, `version`, `signature`."""
    return SavedModelExtractor(**options)
