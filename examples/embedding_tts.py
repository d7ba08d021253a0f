"""`examples.fastspeech_lite` conditioned on a speaker embedding an extractor stored per clip, instead
of a table of speaker ids: a plug-in for `melshards train` (train/contract.py).

    melshards train 'shards/train-*.tfrecord' --model examples.embedding_tts:build --model-dir runs/emb

The shards come from a preprocess run whose config has an extractor giving a vector output named
`speaker_embedding` (configs/extractors.yaml; docs/preprocess.md, Extractors you plug in). Training
reads each clip's own embedding (`build.features`); `generate`, so `melshards synthesize TEXT --speaker
NAME`, reads the speaker's stored centroid (`Schema.centroids`, the mean of its training clips'
embeddings, a constant table of the model gathered by speaker_id).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from examples.fastspeech_lite import FastSpeechLite, Options, built, validate

EMBEDDING = "speaker_embedding"


class EmbeddingTTS(FastSpeechLite):
    def __init__(self, opts: Options, schema, **kw):
        super().__init__(opts, schema, **kw)
        self.centroids = tf.constant(np.asarray(schema.centroids(EMBEDDING), np.float32))  # [speakers, dim]
        self.project = keras.layers.Dense(opts.d_model)  # the embedding into the model's width

    def condition(self, speaker, language_id):
        # a training batch gives the clips' embeddings [B, dim]; generate gives speaker ids [B]
        vector = speaker if speaker.shape.rank == 2 else tf.gather(self.centroids, speaker)
        return self.project(tf.cast(vector, tf.float32)) + self.language_embed(language_id)

    def speaker_input(self, batch):
        return batch[EMBEDDING]


def build(schema, options: dict) -> EmbeddingTTS:
    """The factory: `--model examples.embedding_tts:build`."""
    return built(EmbeddingTTS, schema, options)


build.validate = validate
build.features = (EMBEDDING,)
