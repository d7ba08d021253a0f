"""Per-clip extractors you plug in (docs/preprocess.md, Extractors): pretrained models whose outputs
(a speaker embedding, per-frame values, codec tokens) the job stores in the records beside the mel.

The preprocess config lists them (`extractors:`), each a factory named `package.module:function`
(`melshards.shards_schema.factories.load_callable`, the rule `--model` plug-ins follow) called with
the entry's `options` once per worker (`Extractors`, from the measure stage's `DoFn.setup`). The
factory returns an object with:

- `name` (str), `version` (str), `sample_rate` (int: the rate its clips are resampled to);
- `outputs`: a sequence of `melshards.shards_schema.extracted.ExtractorOutput` (or their dicts);
- `fingerprint` (str, optional): a hash of its code and weights. Without one, the job hashes the
  factory's name and its module's source (Python code alone: an extractor with weights should say its own);
- `__call__(clips)`: a list of mono float32 clips at `sample_rate` (each the trimmed samples the
  mel is made of) -> one `{output name: array}` per clip.

An extractor that raises on a batch is called again clip by clip; a clip it fails on, or whose output
does not match the declaration (`ExtractorOutput.check`), is rejected with the reason
`extractor_failed` and its detail (rejected.jsonl), unless it fails on most clips: more than half of
the last 100 a worker gave it, once it was given 20 (`FailureGuard`), stops the job with one line
naming it and its first error (`ExtractorFailing`; `run.input_error` finds it in what the job
raised). A factory that does not import or returns something unusable stops the job at once
(`ExtractorError`, a ConfigError). Its schema record (`load`) holds its `options`, which must be JSON
values: they are in schema.json and in its feature cache part's key.

Two adapters wrap model files, in `melshards.extractors` (above the job: the SavedModel one imports
TensorFlow, which the job itself never does): `onnx_model` (onnxruntime) and `saved_model`.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import hashlib
import inspect
import json
import sys
import traceback
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from melshards.preprocess.clip import audio
from melshards.preprocess.config import ExtractorConfig, PreprocessConfig
from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.extracted import ExtractorOutput
from melshards.shards_schema.factories import load_callable, split_spec
from melshards.shards_schema.schema import Schema

FAILED = "extractor_failed"  # the rejection reason of a clip an extractor fails on


class ExtractorError(ConfigError):
    """An extractor cannot be used; the message names its factory and what to fix."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    """An extractor as the job runs it: the object, its declared outputs and its schema record."""

    extractor: Any
    outputs: tuple[ExtractorOutput, ...]
    record: dict[str, Any]
    batch_size: int


def _outputs(spec: str, declared: Any) -> tuple[ExtractorOutput, ...]:
    try:
        outs = tuple(o if isinstance(o, ExtractorOutput) else ExtractorOutput(**o) for o in declared)
    except (TypeError, ValueError) as e:
        raise ExtractorError(f"extractor {spec!r}: its outputs {declared!r} do not declare outputs: {e}") from e
    if not outs:
        raise ExtractorError(f"extractor {spec!r} declares no outputs")
    return outs


def source_fingerprint(obj: Any) -> str:
    """sha256 of the qualified name of `obj` and the source of the module defining it (the default
    fingerprint: its code)."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    try:
        text = inspect.getsource(module) if module is not None else repr(obj)
    except (OSError, TypeError):
        text = repr(obj)
    name = f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', repr(obj))}"
    return hashlib.sha256(f"{name}\n{text}".encode()).hexdigest()


def recorded_options(entry: ExtractorConfig) -> dict[str, Any]:
    """The factory's options as schema.json and the cache key record them (JSON: a tuple becomes a
    list); ExtractorError for an option JSON cannot hold."""
    try:
        return json.loads(json.dumps(entry.options, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ExtractorError(
            f"extractor factory {entry.factory!r}: its options {entry.options!r} are recorded in schema.json "
            f"and the feature cache's key, and {e}; give strings, numbers, booleans, lists and mappings"
        ) from e


# How an extractor factory is named, for `split_spec` and `load_callable`'s messages.
_NAMING = ("extractor factory", "melshards.extractors:onnx_model", ExtractorError)


def check_entries(entries: Sequence[ExtractorConfig], importable: bool) -> None:
    """ExtractorError, before the job, for what the config shows wrong without building an extractor:
    a factory not named `package.module:function`, an entry given twice (the same factory and
    options), and, where `importable` (a local run: a remote runner's workers may have packages this
    machine lacks), a factory that does not import or is not there, or options its signature does not
    take. What only building one shows (it raises, returns no extractor) is found by `load`, in the job."""
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries, 1):
        split_spec(entry.factory, *_NAMING)
        same = json.dumps([entry.factory, entry.options], sort_keys=True, default=repr)
        if same in seen:
            raise ExtractorError(
                f"extractors: entries {seen[same]} and {i} are the same extractor ({entry.factory!r} with options "
                f"{entry.options}); remove one"
            )
        seen[same] = i
        if importable:
            check_options(entry.factory, load_callable(entry.factory, *_NAMING), entry.options)


def check_options(spec: str, factory: Any, options: dict[str, Any]) -> None:
    """ExtractorError for options the factory's signature does not take, or a required one missing
    (nothing is checked for a factory taking **options, or one whose signature cannot be read)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes = f"it takes {', '.join(named)}" if named else "it takes no options"
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for name in options:
            if name not in named:
                close = difflib.get_close_matches(name, named, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ExtractorError(f"extractor factory {spec!r} has no option {name!r}: {hint}({takes})")
    missing = [
        n
        for n, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and n not in options
    ]
    if missing:
        raise ExtractorError(
            f"extractor factory {spec!r} needs the option(s) {', '.join(missing)}: give them under the entry's options"
        )


def load(entry: ExtractorConfig) -> Loaded:
    """Build one configured extractor and check what it declares; ExtractorError if it cannot be used."""
    factory = load_callable(entry.factory, *_NAMING)
    options = recorded_options(entry)
    try:
        extractor = factory(**entry.options)
    except ExtractorError:
        raise
    except Exception as e:  # noqa: BLE001 (any error of user code while building is reported the same way)
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        raise ExtractorError(f"extractor factory {entry.factory!r} failed with options {entry.options}: {last}") from e
    missing = [a for a in ("name", "version", "sample_rate", "outputs") if not hasattr(extractor, a)]
    if missing or not callable(extractor):
        raise ExtractorError(
            f"extractor factory {entry.factory!r} returned a {type(extractor).__name__} without "
            f"{', '.join(missing) or '__call__'}; see melshards/preprocess/clip/extractor_plugins.py for what an extractor has"
        )
    sr = extractor.sample_rate
    if not isinstance(sr, int) or isinstance(sr, bool) or sr <= 0:
        raise ExtractorError(f"extractor {extractor.name!r}: sample_rate {sr!r} must be a positive integer")
    outputs = _outputs(entry.factory, extractor.outputs)
    fingerprint = getattr(extractor, "fingerprint", None) or source_fingerprint(factory)
    record = {
        "name": str(extractor.name),
        "version": str(extractor.version),
        "fingerprint": str(fingerprint),
        "factory": entry.factory,
        "options": options,
        "sample_rate": sr,
        "outputs": [o.to_dict() for o in outputs],
    }
    return Loaded(extractor, outputs, record, entry.batch_size)


def check_names(loaded: Sequence[Loaded], taken: Sequence[str]) -> None:
    """ExtractorError when two outputs, or an output and a record feature (`taken`), share a name."""
    seen = set(taken)
    for x in loaded:
        for o in x.outputs:
            names = [f.name for f in o.features(1, 1, 1)]
            clash = [n for n in names if n in seen]
            if clash:
                raise ExtractorError(
                    f"extractor {x.record['name']!r}: output name {clash[0]!r} is already a record feature "
                    "or another extractor's output; rename it"
                )
            seen.update(names)


class Extractors:
    """The run's extractors in one worker, built on first use (`loaded`), and applied to batches."""

    def __init__(self, entries: Sequence[ExtractorConfig], taken: Sequence[str] = ()):
        self.entries, self.taken = tuple(entries), tuple(taken)
        self._loaded: list[Loaded] | None = None
        self.guards: dict[int, FailureGuard] = {}  # per extractor (its index), in this worker

    @property
    def loaded(self) -> list[Loaded]:
        if self._loaded is None:
            self._loaded = [load(e) for e in self.entries]
            check_names(self._loaded, self.taken)
        return self._loaded

    def records(self) -> list[dict[str, Any]]:
        return [x.record for x in self.loaded]

    def vectors(self) -> tuple[str, ...]:
        """The names of the fixed-size vector outputs (whose per-speaker means are the centroids)."""
        return tuple(o.name for x in self.loaded for o in x.outputs if o.kind == "vector")

    def apply(
        self,
        clips: Sequence[np.ndarray],
        mel_frames: Sequence[int],
        sample_rate: int,
        hop_length: int,
        wanted: Sequence[Collection[int]] | None = None,
    ) -> list[dict[str, np.ndarray] | str]:
        """Trimmed clips at `sample_rate` and their mel frames -> per clip, the outputs of the extractors
        `wanted[clip]` (indices into the config's list; default: every one), checked and cast to their
        declared dtypes, or the detail of why a clip is rejected. ExtractorFailing when one fails on too
        many of the clips this worker gives it (`FailureGuard`)."""
        results: list[dict[str, np.ndarray] | str] = [{} for _ in clips]
        for j, x in enumerate(self.loaded):
            todo = [i for i, r in enumerate(results) if isinstance(r, dict) and (wanted is None or j in wanted[i])]
            guard = self.guards.setdefault(j, FailureGuard(x.record["name"]))
            for start in range(0, len(todo), x.batch_size):
                idx = todo[start : start + x.batch_size]
                batch = [resample(clips[i], sample_rate, x.extractor.sample_rate) for i in idx]
                for i, out in zip(idx, call_batch(x, batch)):
                    checked = out if isinstance(out, str) else _checked(x, out, mel_frames[i], hop_length, sample_rate)
                    guard.add(checked if isinstance(checked, str) else None)
                    if isinstance(checked, str):
                        results[i] = f"{x.record['name']}: {checked}"
                    else:
                        results[i].update(checked)  # type: ignore[union-attr]  # a dict until rejected
                guard.check()
        return results


def _checked(x: Loaded, out: dict, mel_frames: int, hop_length: int, sample_rate: int) -> dict | str:
    """An extractor's outputs for one clip -> its declared outputs checked against the declaration
    (`ExtractorOutput.check`) and cast to their dtypes, or what is wrong with them."""
    checked = {}
    for o in x.outputs:
        if o.name not in out:
            return f"no output {o.name!r} (it gave {sorted(out)})"
        value, problem = o.check(out[o.name], mel_frames, hop_length, sample_rate)
        if problem:
            return problem
        checked[o.name] = value
    return checked


GUARD_MIN_CLIPS = 20  # an extractor is judged once a worker has given it this many clips
GUARD_WINDOW = 100  # on the last this many clips a worker gave it
GUARD_SHARE = 0.5  # more than this share of them failed: the job stops


class ExtractorFailing(ExtractorError):
    """An extractor failed on more than half of the last clips a worker gave it (`FailureGuard`): the job
    stops, its one line naming the extractor and its first error, instead of rejecting them all."""


def too_many_failures(failed: Sequence[bool]) -> bool:
    """Whether an extractor's outcomes on the last clips a worker gave it (True: failed), oldest first,
    stop the job: more than `GUARD_SHARE` of the last `GUARD_WINDOW` failed, once there are at least
    `GUARD_MIN_CLIPS`."""
    last = list(failed)[-GUARD_WINDOW:]
    return len(last) >= GUARD_MIN_CLIPS and sum(last) > GUARD_SHARE * len(last)


@dataclasses.dataclass
class FailureGuard:
    """One extractor's outcomes on the clips one worker gave it: a clip it raised on, or whose outputs
    broke the declaration, failed. `check` stops the job (ExtractorFailing) when `too_many_failures`:
    a model server that is down, a wrong model or option, fails every clip, where a clip it cannot
    take (too long, too short) fails alone and is rejected."""

    name: str
    failed: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=GUARD_WINDOW))
    first: str | None = None  # the first failure's detail

    def add(self, problem: str | None) -> None:
        self.failed.append(problem is not None)
        if problem is not None and self.first is None:
            self.first = " ".join(problem.split())  # one line

    def check(self) -> None:
        if too_many_failures(self.failed):
            raise ExtractorFailing(
                f"extractor {self.name!r} failed on {sum(self.failed)} of the last {len(self.failed)} clips a "
                f"worker gave it, the first with: {self.first}; the job stopped rather than reject them all: "
                "fix the extractor or what it reads (a model server, a model file, its options) and run again"
            )


def for_run(cfg: PreprocessConfig) -> Extractors:
    """The config's extractors, their outputs checked against the run's other record features."""
    taken = [f.name for f in Schema.feature_table(1, 1, cfg.mel.n_mels, cfg.optional_features, 1)]
    return Extractors(cfg.extractors, taken)


def same_records(a: list[dict], b: list[dict]) -> list[dict]:
    """The extractor records of two workers' batches, which must be the same (an empty list is a batch
    that ran none: its clips were all rejected, or all read from the cache). ExtractorError otherwise:
    outputs of other code or weights must not mix in one run."""
    if not a or not b or a == b:
        return a or b
    diff = [
        f"{x['name']} {x['version']} {x['fingerprint'][:12]} vs {y['name']} {y['version']} {y['fingerprint'][:12]}"
        for x, y in zip(a, b)
        if x != y
    ]
    raise ExtractorError(
        "the workers loaded different extractors (" + "; ".join(diff or ["another list"]) + "): "
        "a model file changed during the run; run again once it is fixed"
    )


def resample(y: np.ndarray, sr: int, target: int) -> np.ndarray:
    """The clip at the extractor's rate (soxr_hq, as decoding resamples)."""
    if sr == target:
        return y
    return np.ascontiguousarray(audio.load_librosa().resample(y, orig_sr=sr, target_sr=target, res_type="soxr_hq"))


def _failure(e: BaseException) -> str:
    return traceback.format_exception_only(type(e), e)[-1].strip()


def call_batch(x: Loaded, batch: list[np.ndarray]) -> list[dict | str]:
    """One extractor on a batch -> per clip its outputs, or why it failed. A batch call that raises or
    gives the wrong number of results is retried clip by clip, so one bad clip fails alone."""
    try:
        outs = list(x.extractor(batch))
        if len(outs) == len(batch) and all(isinstance(o, dict) for o in outs):
            return outs
    except Exception:  # noqa: BLE001 (user code: the clip-by-clip calls say which clip, and why)
        pass
    results: list[dict | str] = []
    for y in batch:
        try:
            one = list(x.extractor([y]))
        except Exception as e:  # noqa: BLE001 (user code failing on a clip rejects the clip, not the job)
            results.append(_failure(e))
            continue
        ok = len(one) == 1 and isinstance(one[0], dict)
        results.append(one[0] if ok else f"returned {len(one)} results for one clip, not one dict")
    return results
