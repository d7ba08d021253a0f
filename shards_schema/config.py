"""Typed config loading: YAML mapping -> nested dataclasses, unknown keys are errors.

Every default lives on the dataclass field; nothing else in the code invents one.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or value is wrong; the message says which key and how to fix it."""


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _coerce(value: Any, tp: Any, where: str) -> Any:
    tp = _strip_optional(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys raise ConfigError naming the valid ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; valid keys are: {', '.join(fields)}. "
            "Fix the spelling or remove the key.")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from e
    return obj


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
