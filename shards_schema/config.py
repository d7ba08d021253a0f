"""Typed config loading: YAML mapping -> nested dataclasses, validated by pydantic in one way.

Every default lives on the dataclass field; nothing else in the code invents one. Every bound lives
on the field too, as `Annotated[int, Field(gt=0)]` (pydantic reads it; plain dataclasses ignore it,
so `dataclasses.replace` stays cheap and `check` validates the result). Unknown keys are errors that
list the valid ones, and every error names its key, dotted (`mel.n_fft`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import annotated_types
import yaml
from pydantic import AfterValidator, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or value is wrong; the message says which key and how to fix it."""


def _dataclasses_in(cls: type) -> Iterator[type]:
    yield cls
    for tp in typing.get_type_hints(cls).values():
        for t in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(t) and isinstance(t, type):
                yield from _dataclasses_in(t)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    """pydantic's validator of config dataclass `cls`: its fields' types (declare them StrictInt,
    StrictFloat, ... so that "1024" is not an int and true not a number) and the bounds declared on them (`Annotated[int, Field(gt=0)]`); unknown keys
    are errors in every section."""
    for c in _dataclasses_in(cls):
        if "__pydantic_config__" not in c.__dict__:
            c.__pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[attr-defined]  # the class attribute pydantic reads on a stdlib dataclass
    return TypeAdapter(cls)


def one_of(*choices: str) -> AfterValidator:
    """A str field that must be one of `choices` (`Annotated[str, one_of("a", "b")]`)."""

    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError(CHOICE, "choose one of {choices}", {"choices": ", ".join(choices)})
        return value

    return AfterValidator(check)


CHOICE, VALUE = "config_choice", "config_value"  # error types of one_of and of a field's own check


def bounds_text(meta: Iterable[Any]) -> str:
    """The bounds in a field's Annotated metadata, as ">= 0 and < 1"."""
    parts = []
    for m in meta:
        for item in getattr(m, "metadata", None) or [m]:  # a FieldInfo holds its bounds in .metadata
            for name, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                if isinstance(item, getattr(annotated_types, name.capitalize())):
                    parts.append(f"{op} {getattr(item, name):g}")
    return " and ".join(parts)


def field_bounds(cls: type, path: Sequence[str]) -> str:
    """bounds_text of the field at `path` (names) under dataclass `cls`, "" if none or not found."""
    for i, name in enumerate(path):
        hints = typing.get_type_hints(cls, include_extras=True) if dataclasses.is_dataclass(cls) else {}
        if name not in hints:
            return ""
        tp = hints[name]
        if i == len(path) - 1:
            # an optional field (`Annotated[float, Field(...)] | None`) has its bounds on the number
            options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
            annotated = [t for t in options if typing.get_origin(t) is Annotated]
            return bounds_text(typing.get_args(annotated[0])[1:]) if annotated else ""
        cls = tp
    return ""


def _field_names(cls: type, path: Sequence[str]) -> list[str]:
    for name in path:
        cls = typing.get_type_hints(cls)[name]
    return [f.name for f in dataclasses.fields(cls)]


def error_texts(cls: type, errors: list[ErrorDetails], prefix: str = "") -> list[str]:
    """pydantic's errors for config dataclass `cls` as sentences naming the dotted key (after `prefix`)."""
    out: list[str] = []
    unknown: dict[tuple[str, ...], list[str]] = {}
    for e in errors:
        loc = [str(x) for x in e["loc"] if not str(x).startswith("function-")]
        key = prefix + ".".join(loc)
        kind, value = e["type"], e.get("input")
        if kind in ("unexpected_keyword_argument", "extra_forbidden"):
            unknown.setdefault(tuple(loc[:-1]), []).append(loc[-1])
        elif kind == "missing":
            out.append(f"{key} is missing")
        elif kind in (CHOICE, VALUE):
            out.append(f"{key} is {value!r}; {e['msg']}" if kind == CHOICE else f"{key} is {value!r}, {e['msg']}")
        elif kind.split("_")[0] in ("int", "float", "bool", "string", "dataclass", "dict"):
            wanted = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string"}.get(
                kind.split("_")[0], "a mapping"
            )
            out.append(f"{key} is {value!r}, must be {wanted}")
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
            bounds = field_bounds(cls, loc)
            finite = "a finite number " if kind == "finite_number" else ""
            out.append(f"{key} is {value!r}, must be {finite}{bounds}".rstrip())
        else:
            out.append(f"{key}: {e['msg']}")
    for section, names in unknown.items():
        where = (prefix + ".".join(section)).rstrip(".")
        out.insert(
            0,
            f"{where + ': ' if where else ''}unknown key(s) {', '.join(sorted(names))}; valid keys are: "
            f"{', '.join(_field_names(cls, section))}. Fix the spelling or remove the key.",
        )
    return out


def from_dict(cls: type[T], data: Any, where: str = "config", prefix: str = "") -> T:
    """Build config dataclass ``cls`` from ``data``, validated by pydantic (types, declared bounds,
    unknown keys): a ConfigError names every bad key, dotted (``mel.n_fft``) after ``prefix``."""
    try:
        return _adapter(cls).validate_python(data)  # type: ignore[arg-type]  # a class is hashable; mypy checks its unbound __hash__
    except ValidationError as e:
        raise ConfigError(f"{where}: " + "; ".join(error_texts(cls, e.errors(), prefix))) from None


def check(obj: Any, what: str, prefix: str = "") -> None:
    """Validate a config dataclass built or changed in code (dataclasses.replace, overrides) the same way."""
    try:
        _adapter(type(obj)).validate_python(dataclasses.asdict(obj))  # type: ignore[arg-type]  # a class is hashable; mypy checks its unbound __hash__
    except ValidationError as e:
        raise ConfigError(f"invalid {what}: " + "; ".join(error_texts(type(obj), e.errors(), prefix))) from None


def load_yaml(cls: type[T], path: str | Path) -> T:
    """Load ``path`` (YAML) into ``cls``; a missing file or bad YAML is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config with a file from configs/")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return from_dict(cls, data, where=str(path))


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)
