"""The model plug-in contract of `melshards train`: what a factory returns and what the trainer calls.

    melshards train ... --model package.module:factory      (or `model: {factory: ...}` in the config)

A **factory** is `factory(schema, options) -> keras.Model`:
- `schema` is the shards' `shards_schema.Schema` (vocabulary, static shapes, mel statistics, and the
  `speakers` and `languages` tables: `len(schema.speakers)` and `len(schema.languages)` size the
  model's speaker and language embeddings, whose ids are the records' `speaker_id` and `language_id`);
- `options` is the config's `model:` section as a plain dict, without its `factory` key (free-form:
  the factory owns its validation and should raise `melshards.shards_schema.config.ConfigError` naming a bad
  key);
- the model's variables must exist when it returns: the trainer builds the optimizer before the
  first step, so the step traces once. Build it with Keras's `build(input_shape)` creating every
  variable without running the network (as the built-in model does), or by calling it once on zeros;
- layers built without an explicit dtype follow the Keras global dtype policy, which the trainer
  sets to `loop.precision` while the factory runs (float32 for synthesis).
A factory may carry `factory.validate(schema, options)`: cheap checks the trainer runs while it
checks the command line, before building anything.

A factory may carry `factory.features`: the optional record features its model reads besides
MODEL_INPUTS, a tuple of names of `melshards.shards_schema.schema.OPTIONAL_FEATURES` ("pitch",
"energy", "audio", "durations"; `audio` brings `audio_len`), or "reference_mel" (with `reference_len`: an
other_clip run's stored references, or a same_clip run's slices of each record's own mel, cut in the input
pipeline by `melshards.train.references`). The batch then holds MODEL_INPUTS and
those, with the bucket's static shapes (`melshards.train.plugins.model_inputs`). Shards without one of
them stop the run while the command line is checked, before anything is built or compiled, with one
line naming the feature and the preprocess setting that adds it. A model gets only what it asks for,
not every feature the run holds: audio alone is several times the bytes of an 80-bin mel per frame
(docs/performance.md#the-waveform-in-the-batch), and would be parsed and copied to the device every
step for models that ignore it.

The **model** (`TTSModel` below) turns one batch into masked **sums and counts**, never means: the
trainer adds them up over batches, length buckets and replicas (and over the zero-length records
that pad the last validation batch, which must add nothing), then calls `losses_from_terms` once on
the totals. So a loss equals the loss of all the records at once, exactly.

The trainer traces these methods without autograph, as Keras 3 traces a layer's `call`: control flow
that depends on a tensor's value is written with `tf.cond` / `tf.while_loop` (or `keras.ops.cond`);
a Python `if` or `for` on a tensor fails while the step traces, naming the line.

Every model, the built-in Transformer-TTS (`melshards.train.model:build`) included, goes through this
contract; the trainer has no other path. `melshards.train.plugins` checks a model against it before anything
compiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

BUILTIN_FACTORY = "melshards.train.model:build"
# Names model dirs recorded before the trainer became `melshards.train` (one import name).
RENAMED_FACTORIES = {"train.model:build": BUILTIN_FACTORY}


def current_factory(spec: str) -> str:
    """A factory as a model dir may have recorded it -> the name it has now."""
    return RENAMED_FACTORIES.get(spec, spec)


# What the trainer reads from a record, so what every model's batch holds; the shapes and dtypes come
# from the schema (bucket). speaker_id and language_id are int32 scalars per record: indices into
# schema.speakers and schema.languages (a model may ignore them).
MODEL_INPUTS = ("text_ids", "text_len", "speaker_id", "language_id", "mel", "mel_len")

# Keys every loss_terms dict holds, besides the model's own sums and counts: real (non-padding)
# records in the batch and their mel frames. The trainer reports throughput from them.
REQUIRED_TERMS = ("examples", "mel_frames")


@runtime_checkable
class TTSModel(Protocol):
    """A keras.Model the trainer can drive. `generate` is optional (needed only by `synthesize`)."""

    def loss_terms(self, batch: Mapping[str, Any], seed: Any, training: bool) -> dict[str, Any]:
        """Masked sums and counts over one batch: float32 scalars, REQUIRED_TERMS among them.

        batch: {name: tensor} for MODEL_INPUTS and the factory's `features`, static shapes [B, ...] (log-mel not normalised;
        `melshards.train.step.Normaliser(schema)` normalises in-graph; speaker_id and language_id int32
        [B]). Records with mel_len 0 are padding (their ids are 0): they must add 0 to every term. seed: int32 [2], (loop.seed, step) while training: a
        stateless key for dropout, so a resumed run draws the same masks. Runs inside an XLA
        compiled function: TensorFlow ops only, static shapes.
        """

    def loss_counts(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The count terms of `loss_terms` (the denominators: valid frames, real records, ...),
        computed from the batch alone, without running the network.

        Under tf.distribute the trainer sums them over all replicas before the backward pass and
        gives each replica `losses_from_terms(dict(its terms, **global counts))`, so the summed
        gradients are those of the global masked mean. That is exact when `losses_from_terms` is
        linear in the sums (masked means and their weighted sums are)."""

    def losses_from_terms(self, terms: Mapping[str, Any]) -> dict[str, Any]:
        """Terms (summed over any number of batches) -> named scalar losses; "loss" is minimised."""


class GeneratingModel(TTSModel, Protocol):
    """A model `melshards synthesize` can speak with."""

    def generate(self, text_ids: Any, text_len: Any, speaker_id: Any, language_id: Any) -> dict[str, Any]:
        """text_ids int32 [1, L], text_len, speaker_id, language_id int32 [1] -> {"mel": float32
        [1, T, n_mels] log-mel (the shards' scale, not normalised), "mel_len": int32 [1] frames of
        speech}. L is the longest max_text_len over the schema's buckets
        (melshards.train.synthesize.text_capacity: a bucket of shorter clips can hold longer texts than
        the largest bucket); the ids index schema.speakers and schema.languages. Static shapes;
        compiled with XLA."""


class ModelFactory(Protocol):
    def __call__(self, schema: Any, options: dict[str, Any]) -> TTSModel: ...
