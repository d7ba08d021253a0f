"""Finding a model factory (`package.module:factory`) and checking what it builds against
`melshards.train.contract`, before anything compiles. Every failure is a `PluginError` naming what is wrong.

Factories are imported with `importlib.import_module`, from `sys.path` and the current directory
(as `python -m` and uvicorn do): an installed package, or a module under the directory the command
runs in, such as this repository's `examples/` (`--model examples.fastspeech_lite:build`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import keras

from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.factories import check_call, load_callable
from melshards.train import device
from melshards.train.contract import MODEL_INPUTS, REQUIRED_TERMS
from melshards.train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)


class PluginError(ConfigError):
    """The model plug-in cannot be used; the message names the factory and what to fix."""


def load_factory(spec: str) -> Callable:
    """`package.module:factory` -> the callable; raises PluginError if it cannot be found
    (`melshards.shards_schema.factories.load_callable`) or cannot be called as factory(schema, options)
    (`check_call`: its signature, read before anything is built or written)."""
    factory = load_callable(spec, "model factory", "examples.fastspeech_lite:build", PluginError, "factory")
    check_call(factory, spec, "model factory", "factory(schema, options)", PluginError, None, {})
    return factory


def model_inputs(spec: str) -> tuple[str, ...]:
    """What the model's batch holds: MODEL_INPUTS, then the optional features its factory asks for
    (`factory.features`, `melshards.train.contract`), with `audio_len` beside `audio`, then the
    extractors' outputs it asks for (any other names, in its order: `check_features` finds them in
    the schema)."""
    from melshards.shards_schema.schema import OPTIONAL_FEATURES

    asked = getattr(load_factory(spec), "features", ())
    if isinstance(asked, str) or not all(isinstance(n, str) for n in asked):
        raise PluginError(
            f"model factory {spec!r}: `features` is {asked!r}; give a tuple of feature names, "
            f"e.g. ('durations', 'pitch')"
        )
    asked = tuple("reference" if n == "reference_mel" else n for n in asked)  # the reference's one name
    unknown = [n for n in asked if n not in OPTIONAL_FEATURES and n != "audio_len" and not n.isidentifier()]
    if unknown:
        raise PluginError(
            f"model factory {spec!r} asks for the feature(s) {', '.join(map(repr, unknown))}; the "
            f"optional features are {', '.join(OPTIONAL_FEATURES)}, and extractor outputs are named as identifiers"
        )
    extra = tuple(n for n in OPTIONAL_FEATURES if n in asked and n != "reference")
    reference = ("reference_mel", "reference_len") if "reference" in asked else ()
    extracted = tuple(n for n in asked if n not in OPTIONAL_FEATURES and n != "audio_len" and n not in MODEL_INPUTS)
    return MODEL_INPUTS + extra + (("audio_len",) if "audio" in extra else ()) + reference + extracted


def check_features(spec: str, schema) -> tuple[str, ...]:
    """`model_inputs(spec)`, or PluginError naming the first feature the shards lack and what adds it."""
    from melshards.shards_schema import SchemaError
    from melshards.train.references import REFERENCE_FEATURES, same_clip

    names = model_inputs(spec)
    cut = same_clip(schema, names) is not None  # a same_clip run's references are cut from the mel, not stored
    try:
        schema.require(
            [n for n in names[len(MODEL_INPUTS) :] if not (cut and n in REFERENCE_FEATURES)], who=f"model {spec!r}"
        )
    except SchemaError as e:
        raise PluginError(str(e)) from None
    return names


def validate_options(spec: str, schema, options: dict) -> None:
    """The features the factory asks for (`check_features`), then its own cheap checks
    (`factory.validate`), if it has them."""
    check_features(spec, schema)
    validate = getattr(load_factory(spec), "validate", None)
    if validate is not None:
        validate(schema, dict(options))


@contextlib.contextmanager
def dtype_policy(precision: str):
    """The Keras global dtype policy for the duration: layers built without a dtype follow it."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def zero_batch(schema, batch_size: int = 1, names: tuple[str, ...] = MODEL_INPUTS) -> dict:
    """A batch of zero-length (padding) records of the schema's shapes (the train step's,
    `step.step_specs`: with a same_clip run's references)."""
    from melshards.train.references import same_clip
    from melshards.train.step import step_specs

    specs = step_specs(schema.largest, batch_size, None, names, same_clip(schema, names))
    return {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}


def check_model(model: Any, spec: str, schema, names: tuple[str, ...] = MODEL_INPUTS) -> tuple[str, ...]:
    """Check `model` against the contract by calling it once, eagerly, on a tiny padding batch.

    Returns the names of its losses ("loss" first). Eager: nothing is traced or compiled here.
    """
    if not isinstance(model, keras.Model):
        raise PluginError(
            f"model factory {spec!r} returned a {type(model).__module__}.{type(model).__name__}, "
            "not a keras.Model; return the model it builds"
        )
    for method in ("loss_terms", "loss_counts", "losses_from_terms"):
        if not callable(getattr(model, method, None)):
            raise PluginError(
                f"the model of {spec!r} ({type(model).__name__}) has no {method}() method; "
                "see train/contract.py for what the trainer calls"
            )
    terms = model.loss_terms(zero_batch(schema, 1, names), tf.zeros([2], tf.int32), training=False)
    if not isinstance(terms, dict):
        raise PluginError(
            f"{type(model).__name__}.loss_terms returned a {type(terms).__name__}, not a dict of scalar sums and counts"
        )
    missing = [k for k in REQUIRED_TERMS if k not in terms]
    if missing:
        raise PluginError(
            f"{type(model).__name__}.loss_terms misses the key(s) {', '.join(missing)} "
            f"(it returned {', '.join(sorted(terms)) or 'nothing'}); the trainer needs "
            f"{', '.join(REQUIRED_TERMS)}: the real records and their mel frames in the batch"
        )
    not_scalar = [k for k, v in terms.items() if tf.convert_to_tensor(v).shape.rank != 0]
    if not_scalar:
        raise PluginError(
            f"{type(model).__name__}.loss_terms returned non-scalar {', '.join(not_scalar)}; "
            "return sums over the batch, so batches add up"
        )
    counts = model.loss_counts(zero_batch(schema, 1, names))
    if not isinstance(counts, dict) or not set(counts) <= set(terms):
        raise PluginError(
            f"{type(model).__name__}.loss_counts must return a dict of some of loss_terms' keys "
            f"(the counts), got {sorted(counts) if isinstance(counts, dict) else type(counts).__name__}"
        )
    losses = model.losses_from_terms(terms)
    if not isinstance(losses, dict) or "loss" not in losses:
        raise PluginError(
            f"{type(model).__name__}.losses_from_terms must return a dict with the key 'loss' (the value minimised)"
        )
    if not model.trainable_variables:
        raise PluginError(f"the model of {spec!r} has no trainable variables")
    return ("loss", *sorted(k for k in losses if k != "loss"))


def build_model(
    spec: str, schema, options: dict, precision: str = "float32", choices: device.Choices | None = None
) -> tuple[Any, tuple[str, ...]]:
    """factory(schema, options) under the `precision` policy and the layer choices of the device the step
    is compiled for (train/device.py; None: this machine's), checked; returns (model, loss names)."""
    factory = load_factory(spec)
    names = check_features(spec, schema)
    with dtype_policy(precision), device.building_for(choices or device.current()):
        model = factory(schema, dict(options))
    return model, check_model(model, spec, schema, names)


def can_generate(model: Any) -> bool:
    return callable(getattr(model, "generate", None))
