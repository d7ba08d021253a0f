"""Finding a callable named `package.module:function`: how `melshards train --model` names a model
factory and the preprocess config names an extractor factory (one rule for both).

Modules are imported with `importlib.import_module`, from `sys.path` and the current directory (as
`python -m` and uvicorn do): an installed package, or a module under the directory the command runs in.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


def split_spec(spec: str, what: str, example: str, error: type[Exception], form: str = "function") -> tuple[str, str]:
    """`package.module:function` -> (module, function), importing nothing; `error(message)` naming `what`
    for a spec of another form (a dotted path without its colon gets the spelling it meant)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        meant = f"; did you mean {':'.join(spec.rsplit('.', 1))!r}?" if not sep and "." in spec.strip(".") else ""
        raise error(f"{what} {spec!r} is not of the form package.module:{form} (e.g. {example}){meant}")
    return module_name, attr


def load_callable(spec: str, what: str, example: str, error: type[Exception], form: str = "function") -> Callable:
    """`package.module:function` -> the callable; `error(message)` naming `what` ("model factory") and
    what is wrong (the form, a module that does not import, a missing name, not a callable)."""
    module_name, attr = split_spec(spec, what, example, error, form)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # last: an installed package of the same name wins
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 (any error while importing user code is reported the same way)
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        raise error(
            f"{what} {spec!r}: module {module_name!r} does not import ({last}). "
            "Install it, or run from the directory that holds it"
        ) from e
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise error(
                f"{what} {spec!r}: module {module_name!r} has no {attr!r}; its callables "
                f"are: {', '.join(public) or '(none)'}"
            )
    if not callable(found):
        raise error(f"{what} {spec!r} is a {type(found).__name__}, not a callable")
    return found


def check_call(found: Callable, spec: str, what: str, call: str, error: type[Exception], *args: Any) -> None:
    """`error(message)` unless `found(*args)` binds to its signature (`inspect.signature`), before it is
    called: the message names `what` and `spec`, the parameters it takes and `call`, how it is called (e.g.
    "factory(schema, options)"). A callable whose signature cannot be read (some builtins) passes."""
    import inspect

    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError as e:
        name = spec.rpartition(":")[2].rpartition(".")[2] or call.partition("(")[0]
        raise error(
            f"{what} {spec!r} takes {signature}, so it cannot be called as {call} ({e}); give it the "
            f"parameters of that call, e.g. def {name}({call.partition('(')[2]}: ..."
        ) from None
