"""Text ids -> mel with a trained model: the generator behind `melshards synthesize` and `--export`.

The model is rebuilt with the factory recorded in the model dir's train_config.json, and speaks
through the contract's optional `generate` (train/contract.py) compiled with XLA at fixed shapes;
a model without it cannot synthesize, and is refused before loading its weights. `melshards synthesize`
keeps its compiled program in the persistent XLA cache (train/xla_cache.py), keyed by the traced
function's and the layers' names and the program: a new process that synthesizes from the same model
traces the same names (it does the same work first) and loads the program instead of compiling it; a
process that built other Keras models or traced other functions first names them differently, and
compiles again. The same function, behind a string-in serving signature (text, speaker name, language
code), is what `--export` saves as a SavedModel.

Who speaks and in which language: `pick_speaker` and `pick_language` resolve --speaker and
--language against the schema's tables (the only one by default), and `normalise` puts TEXT through
the front end that made that language's shards.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import posixpath

import numpy as np

from melshards.shards_schema import SCHEMA_FILE, Language, Schema, SchemaError, Speaker, read_schema
from melshards.shards_schema.config import ConfigError, from_dict
from melshards.shards_schema.schema import first_few
from melshards.shards_schema.text import normalizer_for
from melshards.shards_schema.text_clean import canonical_language
from melshards.shards_schema.vocab import UnknownSymbols, text_ids
from melshards.train.tf_quiet import reading_xla_cache, tf

log = logging.getLogger("melshards.synthesize")


# The exported SavedModel's signature that takes a reference (a model that reads references):
# text, speaker, language, reference_mel [frames, n_mels] float32, reference_len int32 -> mel, mel_len.
REFERENCE_SIGNATURE = "serving_with_reference"


def text_capacity(schema: Schema) -> int:
    """The most text symbols the model reads: the longest max_text_len over the buckets (a bucket of
    shorter clips can hold longer texts than the largest one), which the model's text table covers
    (train/model.py build_text_to_mel). `generate` gets text ids padded to this length."""
    return max(b.max_text_len for b in schema.buckets)


def _pick(table, names, value: str | None, option: str, what: str, find):
    """--speaker/--language VALUE as schema.json's table has it (`find`); the only entry when it is
    left out; ConfigError naming the first few known ones (`names`) and their count otherwise."""
    known = f"this model was trained on {len(table)} {what}(s): {first_few(names)}"
    if value is None:
        if len(table) == 1:
            return table[0]
        raise ConfigError(f"pass {option}: {known}")
    try:
        return find(value)
    except SchemaError:
        raise ConfigError(f"{option.split()[0]} {value!r} is not a {what} the model saw; {known}") from None


def pick_speaker(schema: Schema, name: str | None) -> Speaker:
    """--speaker NAME, one of the speakers with training records (`Schema.training_records`); the only
    one when it is left out. ConfigError for a speaker of the table without any (its embedding never
    trained), naming those the model trained on."""
    trained = [s for s, n in zip(schema.speakers, schema.training_records()) if n]
    if name is not None and name not in {s.name for s in trained} and name in {s.name for s in schema.speakers}:
        raise ConfigError(
            f"--speaker {name!r} has no training records in the shards this model was trained on (its clips were "
            f"all filtered, rejected or in the validation split), so the model never learnt its voice; pass one "
            f"of the {len(trained)} speaker(s) it trained on: {first_few(s.name for s in trained)} (`melshards "
            f"stats SHARDS --by speaker` lists the run's speakers with their clips per split)"
        )
    return _pick(trained, (s.name for s in trained), name, "--speaker NAME", "speaker", schema.speaker)


def pick_language(schema: Schema, code: str | None) -> Language:
    """--language CODE; the only language when it is left out (schema.json does not say which
    languages a speaker speaks, so several need --language)."""
    code = canonical_language(code) if code is not None else None  # `EN` is the run's `en`, as in preprocess
    return _pick(
        schema.languages, (x.code for x in schema.languages), code, "--language CODE", "language", schema.language
    )


def normalise(raw: str, language: Language) -> str:
    """TEXT -> what the model reads, through the front end that made `language`'s shards; TextRejected
    (with preprocess's reason) for text preprocess would not have kept, SchemaError for a front end
    this melshards does not have (other ids than the model learnt)."""
    try:
        normalize = normalizer_for(language.text_frontend)  # refuses another front end, or another version of it
    except ValueError as e:
        raise SchemaError(f"language {language.code!r}: {e}") from e
    return normalize(raw, language.code)  # preprocess's own check: TextRejected for what it would not keep


def check_generate(model) -> None:
    """A generate that takes (text_ids, text_len, speaker_id, language_id), as train/contract.py asks."""
    try:
        inspect.signature(model.generate).bind(None, None, None, None)
    except TypeError:
        raise SchemaError(
            f"{type(model).__name__}.generate{inspect.signature(model.generate)} does not take "
            "(text_ids, text_len, speaker_id, language_id); give it the speaker and language ids "
            "(train/contract.py, GeneratingModel)"
        ) from None


class Synthesizer(tf.Module):
    """Text ids, speaker and language ids -> log-mel with the model's `generate`; `serve` maps a
    normalised string, a speaker name and a language code to the same. For a model that reads references
    (`reads_reference`: its factory asks for reference_mel) `generate_with_reference` and
    `serve_with_reference` take a reference log-mel [frames, n_mels] and its valid frames as well."""

    def __init__(self, model, schema: Schema, reads_reference: bool = False):
        super().__init__()
        # the functions close over the Keras model; only its variables are tracked for export
        # (a tracked Keras 3 model adds its own default serving function, which needs all inputs)
        self.model_variables = [v.value for v in model.variables]
        self.schema = schema
        symbols = tf.constant(list(schema.vocabulary))
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(symbols, tf.range(len(schema.vocabulary), dtype=tf.int32)),
            default_value=-1,
        )
        # the speakers with training records only (`pick_speaker`): another's embedding never trained
        trained = [x for x, n in zip(schema.speakers, schema.training_records()) if n]
        self.speaker_ids = _name_table([x.name for x in trained], [x.id for x in trained])
        self.language_ids = _name_table([x.code for x in schema.languages])
        self.capacity = length = text_capacity(schema)
        # which generate ran (was compiled) in this process; bools, which tf.Module does not track
        self.compiled_plain = self.compiled_reference = False

        @tf.function(
            input_signature=[
                tf.TensorSpec([1, length], tf.int32, name="text_ids"),
                tf.TensorSpec([1], tf.int32, name="text_len"),
                tf.TensorSpec([1], tf.int32, name="speaker_id"),
                tf.TensorSpec([1], tf.int32, name="language_id"),
            ],
            jit_compile=True,
        )
        def generate(text_ids, text_len, speaker_id, language_id):
            out = model.generate(text_ids, text_len, speaker_id, language_id)
            return {"mel": tf.cast(out["mel"], tf.float32), "mel_len": tf.cast(out["mel_len"], tf.int32)}

        # unquoted: tf.debugging escapes quotes in its messages
        speakers = first_few((x.name for x in trained), quote=str)
        languages = first_few((x.code for x in schema.languages), quote=str)

        @tf.function(
            input_signature=[
                tf.TensorSpec([], tf.string, name="text"),
                tf.TensorSpec([], tf.string, name="speaker"),
                tf.TensorSpec([], tf.string, name="language"),
            ]
        )
        def serve(text, speaker, language):
            """Normalised text (the vocabulary's symbols; phones separated by spaces when its unit is the
            phone), a speaker name and a language code (schema.json's)
            -> {"mel": [1, T, n_mels], "mel_len": [1]}."""
            return generate(*model_ids(text, speaker, language))

        def model_ids(text, speaker, language):
            """serve's inputs -> generate's first four (text ids [1, capacity], text_len, speaker_id,
            language_id [1]), checked in-graph: a call with text or names the model cannot read fails."""
            speaker_id, language_id = self.speaker_ids.lookup(speaker), self.language_ids.lookup(language)
            symbols = (
                tf.strings.unicode_split(text, "UTF-8") if schema.text_unit == "character" else tf.strings.split(text)
            )  # phones separated by whitespace
            ids = self.table.lookup(symbols)
            n = tf.shape(ids)[0]
            # refused, never truncated nor skipped (the rule of `text_ids`): the assertion fails the call
            checks = [
                tf.debugging.Assert(
                    tf.reduce_all(ids > 1),
                    [
                        "the text holds symbols the vocabulary of this model lacks (no transcript it was trained on "
                        "had them): leave them out or spell them out in words; they are:",
                        tf.boolean_mask(symbols, ids <= 1),
                    ],
                    summarize=10,
                ),
                tf.debugging.assert_less_equal(
                    n,
                    length,
                    message=(
                        f"the text is longer than the {length} symbols this model reads; split it into shorter "
                        "sentences"
                    ),
                ),
                tf.debugging.assert_positive(n, message="the text holds no symbol of the vocabulary this model reads"),
                tf.debugging.assert_non_negative(
                    speaker_id,
                    message=f"unknown speaker: this model was trained on {len(trained)} speaker(s): {speakers}",
                ),
                tf.debugging.assert_non_negative(
                    language_id,
                    message=(
                        f"unknown language: this model was trained on {len(schema.languages)} language(s): {languages}"
                    ),
                ),
            ]
            with tf.control_dependencies(checks):
                n = tf.identity(n)
            return (
                tf.pad(ids, [[0, length - n]])[None, :],
                tf.reshape(n, [1]),
                tf.reshape(speaker_id, [1]),
                tf.reshape(language_id, [1]),
            )

        self.generate, self.serve = generate, serve
        self.generate_with_reference = self.serve_with_reference = None
        if reads_reference and schema.reference_frames:  # other_clip (stored) or same_clip (cut) references
            frames = schema.reference_frames

            @tf.function(
                input_signature=[
                    tf.TensorSpec([1, length], tf.int32, name="text_ids"),
                    tf.TensorSpec([1], tf.int32, name="text_len"),
                    tf.TensorSpec([1], tf.int32, name="speaker_id"),
                    tf.TensorSpec([1], tf.int32, name="language_id"),
                    tf.TensorSpec([1, frames, schema.n_mels], tf.float32, name="reference_mel"),
                    tf.TensorSpec([1], tf.int32, name="reference_len"),
                ],
                jit_compile=True,
            )
            def generate_with_reference(text_ids, text_len, speaker_id, language_id, reference_mel, reference_len):
                out = model.generate(text_ids, text_len, speaker_id, language_id, reference_mel, reference_len)
                return {"mel": tf.cast(out["mel"], tf.float32), "mel_len": tf.cast(out["mel_len"], tf.int32)}

            @tf.function(
                input_signature=[
                    tf.TensorSpec([], tf.string, name="text"),
                    tf.TensorSpec([], tf.string, name="speaker"),
                    tf.TensorSpec([], tf.string, name="language"),
                    tf.TensorSpec([frames, schema.n_mels], tf.float32, name="reference_mel"),
                    tf.TensorSpec([], tf.int32, name="reference_len"),
                ]
            )
            def serve_with_reference(text, speaker, language, reference_mel, reference_len):
                """serve's inputs and a reference: its log-mel [frames, n_mels] by the shards' settings
                (`melshards.preprocess.write.other_clip_references.reference_of_wav` computes it from a WAV, as `melshards
                synthesize --reference` does), padded with the schema's mel pad_value after its
                reference_len valid frames -> {"mel": [1, T, n_mels], "mel_len": [1]} in its voice."""
                return generate_with_reference(
                    *model_ids(text, speaker, language), reference_mel[None], tf.reshape(reference_len, [1])
                )

            self.generate_with_reference, self.serve_with_reference = generate_with_reference, serve_with_reference

    def speak(self, ids, n: int, speaker: Speaker, language: Language, reference=None) -> dict:
        """`generate` of text ids [1, capacity] (of which n are text) by `speaker` in `language`; with
        `reference` ((log-mel [frames, n_mels] of the shards' settings, valid frames): `melshards synthesize
        --reference`), in its voice, for a model that reads references (ValueError otherwise)."""
        if reference is not None:
            if self.generate_with_reference is None:
                raise ValueError(
                    "this model does not read references (its factory asks for no reference_mel, or its shards "
                    "have none); leave out --reference, or train a model that reads references "
                    "(examples/reference_tts.py) on a run with reference.source: other_clip or same_clip"
                )
            mel, valid = reference
            with self._first_call("reference"):
                return self.generate_with_reference(
                    tf.constant(ids),
                    tf.constant([n], tf.int32),
                    tf.constant([speaker.id], tf.int32),
                    tf.constant([language.id], tf.int32),
                    tf.constant(np.asarray(mel, np.float32)[None]),
                    tf.constant([valid], tf.int32),
                )
        with self._first_call("plain"):
            return self.generate(
                tf.constant(ids),
                tf.constant([n], tf.int32),
                tf.constant([speaker.id], tf.int32),
                tf.constant([language.id], tf.int32),
            )

    def _first_call(self, which: str):
        """Around a call of a generate: at its first, which compiles it and may load its program from the
        persistent XLA cache, that cache's read noise is dropped (`tf_quiet.reading_xla_cache`)."""
        first = not getattr(self, f"compiled_{which}")
        setattr(self, f"compiled_{which}", True)
        return reading_xla_cache() if first else contextlib.nullcontext()

    def export(self, path: str) -> None:
        """The SavedModel into `path`, then `EXPORT_MARK` (what a later --export may write over)."""
        from melshards.shards_schema.ownership import EXPORT_MARK

        signatures = {"serving_default": self.serve}
        if self.serve_with_reference is not None:  # a model that reads references: also in a reference's voice
            signatures[REFERENCE_SIGNATURE] = self.serve_with_reference
        tf.saved_model.save(self, path, signatures=signatures)
        with tf.io.gfile.GFile(posixpath.join(path, EXPORT_MARK), "w") as f:
            f.write(json.dumps({"written_by": "melshards synthesize --export", "schema_version": self.schema.version}))


def _name_table(names: list[str], ids: list[int] | None = None) -> tf.lookup.StaticHashTable:
    """name -> its id in schema.json's table (`ids`; its index in `names` without them); -1 for a name
    not in it."""
    values = tf.range(len(names), dtype=tf.int32) if ids is None else tf.constant(ids, tf.int32, [len(names)])
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(names, tf.string, [len(names)]), values), default_value=-1
    )


def check_model_dir(model_dir: str) -> None:
    """Refuse a path that is not a train model dir before read_schema, whose errors speak of preprocessing."""
    from melshards.train.model_dir import CONFIG_FILE

    if not tf.io.gfile.isdir(model_dir):
        problem = "it does not exist" if not tf.io.gfile.exists(model_dir) else "it is not a directory"
    else:
        missing = [
            name for name in (SCHEMA_FILE, CONFIG_FILE) if not tf.io.gfile.exists(posixpath.join(model_dir, name))
        ]
        if not missing:
            return
        problem = f"it holds no {' and no '.join(missing)}"
    raise SchemaError(
        f"{model_dir} is not a melshards train model dir: {problem}; pass the --model-dir of a `melshards train` run"
    )


def checkpoint_to_restore(model_dir: str) -> str:
    """The checkpoint synthesis restores: the newest in model_dir, checked whole (a truncated data file
    or a missing index is a CheckpointError naming it and the previous intact one). `synthesize`
    calls it before creating anything."""
    from melshards.train.checkpoints import CHECKPOINT_DIR, resume_checkpoint

    latest = resume_checkpoint(posixpath.join(model_dir, CHECKPOINT_DIR), repair=False)
    if latest is None:
        raise SchemaError(
            f"{posixpath.join(model_dir, CHECKPOINT_DIR)} holds no checkpoint; train the model "
            "first, or pass the --model-dir of a run that wrote one"
        )
    return latest


def load_synthesizer(model_dir: str, checkpoint: str | None = None) -> Synthesizer:
    """The model of model_dir rebuilt from the schema and config saved beside it, with the weights of
    `checkpoint` (default: checkpoint_to_restore(model_dir))."""
    from melshards.train.checkpoints import restore_model
    from melshards.train.config import TrainConfig
    from melshards.train.model_dir import CONFIG_FILE
    from melshards.train.plugins import build_model, can_generate, model_inputs

    check_model_dir(model_dir)
    latest = checkpoint or checkpoint_to_restore(model_dir)
    schema = read_schema(posixpath.join(model_dir, SCHEMA_FILE))
    cfg_path = posixpath.join(model_dir, CONFIG_FILE)
    with tf.io.gfile.GFile(cfg_path) as f:
        cfg = from_dict(TrainConfig, json.load(f), where=cfg_path)
    # inference in float32 whatever the training policy
    model, _ = build_model(cfg.model_factory, schema, cfg.model_options, "float32")
    if not can_generate(model):
        raise SchemaError(
            f"the model in {model_dir} ({cfg.model_factory}, {type(model).__name__}) has no "
            "generate(text_ids, text_len, speaker_id, language_id) method, so it cannot "
            "synthesize; add one (train/contract.py, GeneratingModel) and synthesize again"
        )
    check_generate(model)
    check_fits_checkpoint(model, latest, model_dir)  # before restore, whose shape errors are TensorFlow tracebacks
    restore_model(model, latest)  # fails unless every variable of the model is restored
    log.info("restored %s", latest)
    return Synthesizer(model, schema, reads_reference="reference_mel" in model_inputs(cfg.model_factory))


def shape_mismatches(model, checkpoint: str) -> list[tuple[str, list[int], list[int]]]:
    """(variable, its shape in `model`, its shape in `checkpoint`) for every variable of the model the
    training checkpoint (`tf.train.Checkpoint(model=...)`) saved with another shape; reads shapes only."""
    saved = dict(tf.train.list_variables(checkpoint))
    root = tf.train.Checkpoint(model=model)
    view = tf.train.TrackableView(root)  # holds root weakly
    found, seen = [], set()

    def walk(obj, key: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, tf.Variable) or hasattr(obj, "assign") and hasattr(obj, "shape"):
            shape = saved.get(f"{key}/.ATTRIBUTES/VARIABLE_VALUE")
            if shape is not None and list(shape) != list(obj.shape):
                found.append((getattr(obj, "path", key), list(obj.shape), list(shape)))
        for name, child in view.children(obj).items():  # checkpoint keys escape '.' and '/'
            walk(child, f"{key}/{name.replace('.', '..').replace('/', '.S')}" if key else name)

    walk(root, "")
    return found


def check_fits_checkpoint(model, checkpoint: str, model_dir: str) -> None:
    """SchemaError naming the first variable whose shape differs between the model schema.json describes
    and the checkpoint: the schema.json in the model dir is not the one the model was trained with."""
    wrong = shape_mismatches(model, checkpoint)
    if wrong:
        name, now, then = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise SchemaError(
            f"{posixpath.join(model_dir, SCHEMA_FILE)} does not fit the checkpoint {checkpoint}: it makes {name} "
            f"{now}, the checkpoint holds {then}{more}; the schema.json was changed after training (its "
            "vocabulary, speakers, languages and mel bins size the model). Put back the schema.json training "
            "recorded there, or pass the model dir this checkpoint belongs to"
        )


def padded_text_ids(normalised: str, schema: Schema) -> tuple[np.ndarray, int]:
    """Text normalised by `check_text` -> (ids padded to [1, text_capacity], length), by the rule that
    made preprocess's records (`melshards.shards_schema.vocab.text_ids`); ConfigError naming the
    symbols this model's vocabulary lacks (no transcript it was trained on had them), never skipping them."""
    try:
        ids = text_ids(normalised, schema.vocab())
    except UnknownSymbols as e:
        raise ConfigError(
            f"TEXT, normalised to {normalised[:80]!r}, holds {e.named}, which this "
            "model's vocabulary lacks (no transcript it was trained on had them): leave them out or spell them "
            "out in words"
        ) from None
    if not ids:
        raise ConfigError(f"{normalised!r} holds no symbol of this model's vocabulary")
    capacity = text_capacity(schema)
    if len(ids) > capacity:
        raise ConfigError(
            f"the text is {len(ids)} symbols after normalisation; this model reads at most "
            f"{capacity}. Split it into shorter sentences"
        )
    padded = np.zeros([1, capacity], np.int32)
    padded[0, : len(ids)] = ids
    return padded, len(ids)
