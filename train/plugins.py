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


def check_structure(model: Any, spec: str) -> None:
    """The checks that call nothing: a keras.Model with the three methods the trainer calls."""
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


def check_variables(model: Any, spec: str) -> None:
    """The model has trainable variables (a model its factory left unbuilt has none before its first call)."""
    if not model.trainable_variables:
        raise PluginError(f"the model of {spec!r} has no trainable variables")


def ordered_loss_names(names) -> tuple[str, ...]:
    """Loss names as the trainer lists them: "loss" first, then the others sorted."""
    return ("loss", *sorted(k for k in names if k != "loss"))


def reserved_names() -> tuple[str, ...]:
    """What the train step outputs besides the model's losses (train/step.py `k_steps`: STEP_METRICS and
    "losses", the K total losses): a loss of one of these names would be overwritten by them."""
    from melshards.train.step import STEP_METRICS

    return (*STEP_METRICS, "losses")


def step_loss_names(outputs) -> tuple[str, ...]:
    """The loss names of the model a train step was traced with, from the step's output names
    (`StepProgram.outputs`), as `check_model` returns them. Exact: check_model refuses losses named like
    the step's other outputs (`reserved_names`)."""
    reserved = reserved_names()
    return ordered_loss_names(k for k in outputs if k not in reserved)


def check_model(model: Any, spec: str, schema, names: tuple[str, ...] = MODEL_INPUTS) -> tuple[str, ...]:
    """Check `model` against the contract by calling it once, eagerly, on a tiny padding batch.

    Returns the names of its losses (`ordered_loss_names`: "loss" first). Eager: nothing is traced or
    compiled here. A model whose factory left it unbuilt is built by this call.
    """
    check_structure(model, spec)
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
    reserved = reserved_names()
    taken = [k for k in losses if k in reserved]
    if taken:
        raise PluginError(
            f"{type(model).__name__}.losses_from_terms returns {', '.join(taken)}, the name(s) of what the train "
            f"step reports itself ({', '.join(reserved)}); rename the loss(es), e.g. {taken[0]}_loss"
        )
    check_variables(model, spec)
    return ordered_loss_names(losses)


def make_model(
    spec: str, schema, options: dict, precision: str = "float32", choices: device.Choices | None = None
) -> Any:
    """factory(schema, options) under the `precision` policy and the layer choices of the device the step
    is compiled for (train/device.py; None: this machine's); the features it asks for checked against the
    schema (`check_features`) and the model's structure (`check_structure`), not called."""
    factory = load_factory(spec)
    check_features(spec, schema)
    with dtype_policy(precision), device.building_for(choices or device.current()):
        model = factory(schema, dict(options))
    check_structure(model, spec)
    return model


def build_model(
    spec: str, schema, options: dict, precision: str = "float32", choices: device.Choices | None = None
) -> tuple[Any, tuple[str, ...]]:
    """`make_model`, checked against the contract (`check_model`); returns (model, loss names)."""
    model = make_model(spec, schema, options, precision, choices)
    return model, check_model(model, spec, schema, model_inputs(spec))


def can_generate(model: Any) -> bool:
    return callable(getattr(model, "generate", None))
