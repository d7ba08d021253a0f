"""A step as the trainer calls it on one device (`StepProgram`): a graph function registered under a
name derived from what determines it, called with its inputs in order and the variables it captures.

A traced step (`from_trace`) becomes a StepProgram by copying its function definitions (the step and
every function it calls) under new names: `melshards_<kind>_b<bucket>_<key>` and `..._<key>_<n>` for
the ones it calls, where the key (`program_key`) is a hash over everything the trace depends on. The
copies carry no Python stack traces, and each distinct constant once (`_constants_once`). XLA's
persistent cache (train/xla_cache.py) keys a compiled program by the function's name and its HLO, which
holds those names and source lines, so a step called under these names compiles to the same key in every
run that traced the same program.

With the persistent cache on, each StepProgram is saved next to XLA's entries
(`melshards_program__<key>.npz`: the definitions, the input and output names, which state variables
it captures and the values of the constants it captures), and a later run with the same key restores
it (`restore`) instead of tracing: no Python trace, and XLA then finds its compiled program in the
cache (it still lowers the graph to HLO to look it up). A file that does not load, or whose program does
not fit the model's variables, is skipped with a warning and the step is traced.

The key (`program_key`) covers: the TensorFlow, Keras and Python versions, the run's settings (the
train config less the loop's counts and intervals, schema.json, the layer choices, and the source of
melshards' train/ and shards_schema/ and of the model factory's top-level package: every .py file under
it, and XLA_FLAGS: XLA's cache keys an entry by the function's name and HLO, not by the flags it was
compiled under), the program's kind, bucket and input specs. The state variables follow from those; a
restored program is checked against them (`StepProgram.matches`: the indices, shapes and dtypes of the
variables it captures) before the loop calls it. Code a factory imports from another package is not in the key: change the factory's own
package (or clear the cache, `MELSHARDS_XLA_CACHE`) when such code changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from melshards.shards_schema.atomic import atomic_write
from melshards.train.tf_quiet import tf

log = logging.getLogger("melshards.train")

PREFIX = "melshards_program__"  # a saved StepProgram's file name: PREFIX + key + ".npz"
FORMAT = 1  # the saved file's layout


def source_digest(factory: str) -> str:
    """A hash over the source files a step's trace can run: melshards' train/ and shards_schema/ (all train/
    imports, tests/test_layering.py) and, for a factory outside melshards, its top-level package (every .py
    file under it) or its module when that is not a package (`factory`: "package.module:function")."""
    import importlib.util

    train = Path(__file__).resolve().parent
    root = train.parent
    files = set(train.rglob("*.py")) | set((root / "shards_schema").rglob("*.py"))
    top = factory.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top) if top != __name__.split(".")[0] else None
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            files.update(p.resolve() for p in Path(where).rglob("*.py"))
    elif spec is not None and spec.origin and spec.origin.endswith(".py"):
        files.add(Path(spec.origin).resolve())
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def program_key(kind: str, bucket: int, specs: dict, settings: dict) -> str:
    """The hash a StepProgram is named and saved by: `settings` (the train config, schema, layer choices and
    source digest the run passes) with the versions and the program's kind, bucket and input specs. The
    state variables follow from them; a restored program is checked against them (`StepProgram.matches`)."""
    import keras

    what = {
        "format": FORMAT,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": sys.version.split()[0],
        "settings": settings,
        "kind": kind,
        "bucket": bucket,
        "specs": {k: [list(s.shape), s.dtype.name] for k, s in sorted(specs.items())},
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _renamed(library, main: str, new_main: str, key: str):
    """The function definitions (`library`, the step `main` last) with every name replaced: `main` by
    `new_main`, the others by `melshards_<key>_<n>` in the library's order; calls renamed alike."""
    names = {f.signature.name: f"melshards_{key}_{n}" for n, f in enumerate(library) if f.signature.name != main}
    names[main] = new_main
    out = []
    for f in library:
        g = type(f)()
        g.CopyFrom(f)
        g.signature.name = names[f.signature.name]
        for node in g.node_def:
            if node.op in names:
                node.op = names[node.op]
            for value in node.attr.values():
                if value.HasField("func") and value.func.name in names:
                    value.func.name = names[value.func.name]
                if value.HasField("list"):
                    for fn in value.list.func:
                        if fn.name in names:
                            fn.name = names[fn.name]
        out.append(g)
    return out


def _constants_once(f):
    """The function definition `f` with each distinct constant once: a Const node equal to an earlier one in
    everything but its name (dtype, value, device, attributes and control inputs) is dropped, and what read
    it (or was colocated with it) reads (is colocated with) the earlier one. The values the function
    computes are the same; its graph, and so the HLO that TensorFlow lowers it to before every lookup in
    XLA's cache, is smaller (a traced step holds one Const per shape, axis and scalar each of its ops asked
    for, mostly repeats). A Const the function returns as a control output is kept."""
    from tensorflow.core.framework import node_def_pb2

    kept_names = set(f.control_ret.values())
    first: dict[bytes, str] = {}
    alias: dict[str, str] = {}
    for node in f.node_def:
        if node.op != "Const" or node.name in kept_names:
            continue
        bare = node_def_pb2.NodeDef()
        bare.CopyFrom(node)
        bare.name = ""
        bare.ClearField("experimental_debug_info")
        same = bare.SerializeToString(deterministic=True)
        if same in first:
            alias[node.name] = first[same]
        else:
            first[same] = node.name
    if not alias:
        return f

    def read(ref: str) -> str:  # "node:output:index", or "^node" for a control input
        control = ref.startswith("^")
        node, sep, rest = ref[control:].partition(":")
        return ("^" if control else "") + alias.get(node, node) + sep + rest

    g = type(f)()
    g.CopyFrom(f)
    nodes = [n for n in g.node_def if n.name not in alias]
    for node in nodes:
        inputs = [read(ref) for ref in node.input]
        data = [r for r in inputs if not r.startswith("^")]
        control = list(dict.fromkeys(r for r in inputs if r.startswith("^")))  # two aliases of one: one input
        del node.input[:]
        node.input.extend(data + control)
        if "_class" in node.attr:  # colocated with a dropped Const: with the one kept
            groups = node.attr["_class"].list.s
            named = [c.decode() for c in groups]
            groups[:] = [("loc:@" + alias.get(c[5:], c[5:]) if c.startswith("loc:@") else c).encode() for c in named]
    del g.node_def[:]
    g.node_def.extend(nodes)
    for name in list(g.ret):
        g.ret[name] = read(g.ret[name])
    return g


def named_calls_available() -> bool:
    """Whether this TensorFlow's eager context registers a function definition and calls a function by
    name (`context().add_function_def(fdef)`, `has_function(name)`, `call_function(name, tensor_inputs,
    num_outputs)`), which a StepProgram is called through. Where it does not, the trainer makes no
    StepPrograms: each step is called as traced, and traced again by every run (logged)."""
    import inspect

    try:
        from tensorflow.python.eager import context as eager

        ctx = eager.context()
        wanted = {
            "add_function_def": ["fdef"],
            "has_function": ["name"],
            "call_function": ["name", "tensor_inputs", "num_outputs"],
        }
        return all(list(inspect.signature(getattr(ctx, n)).parameters) == args for n, args in wanted.items())
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


def variable_spec(v) -> tuple[list[int], str]:
    """(shape, dtype name) of a variable (a tf.Variable or a Keras one)."""
    return [int(d) for d in v.shape], tf.as_dtype(v.dtype).name


class Scratch:
    """Variables holding zeros that stand for a step's state in a call that must not write it (the warm-up's
    compile calls, train/compile.py): one per key (`handle`), each made by two ops (a resource handle under
    TensorFlow's anonymous name, tf.raw_ops.VarHandleOp, and its assignment, AssignVariableOp) rather than
    a tf.Variable's Python construction; the variables of one shape and dtype are assigned one zeros tensor
    (a step's update writes a new buffer, never the shared one). An anonymous handle holds its variable: it
    is freed with the last reference to its handle (`free` drops this object's)."""

    def __init__(self):
        from tensorflow.python.eager import context as eager  # the name that makes each handle a new variable

        self._anonymous = eager.anonymous_name()
        self._handles: dict = {}
        self._zeros: dict = {}

    def handle(self, key, shape, dtype):
        """The handle of the zeros variable standing for `key` of this shape and dtype, made on its first use
        (a key asked for with another shape, a restored program's that does not fit the model, gets its own)."""
        shape, dtype = [int(d) for d in shape], tf.as_dtype(dtype)
        full = (key, tuple(shape), dtype)
        if full not in self._handles:
            zeros = self._zeros.get((tuple(shape), dtype))
            if zeros is None:
                zeros = self._zeros[tuple(shape), dtype] = tf.zeros(shape, dtype)
            h = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=self._anonymous)
            tf.raw_ops.AssignVariableOp(resource=h, value=zeros)
            self._handles[full] = h
        return self._handles[full]

    def free(self) -> None:
        """Drop every variable made here (their memory back once no call holds their handles); `handle`
        makes new ones after."""
        self._handles, self._zeros = {}, {}


class StepProgram:
    """A step registered in this process under its key's name: called with a batch (a dict of the input
    names) and its captured inputs (`bind`), it returns {output name: tensor}. `captures`: for each captured
    input, the index of the state variable it is, or a constant's value; `variables`: {index: (shape,
    dtype name)} of the state variables it captures."""

    def __init__(
        self, name: str, library: list, inputs: list[str], outputs: list[str], captures: list, variables: dict
    ):
        self.name, self.library, self.inputs, self.outputs, self.captures = name, library, inputs, outputs, captures
        self.variables = {int(i): (list(shape), dtype) for i, (shape, dtype) in variables.items()}
        from tensorflow.python.eager import context as eager  # no public way to call a function by name

        self._context = eager.context()
        for f in library:  # the functions it calls first
            if not self._context.has_function(f.signature.name):
                self._context.add_function_def(f)
        self._constants = [None if isinstance(c, int) else tf.constant(c) for c in captures]

    def matches(self, state: Sequence) -> bool:
        """Whether `state` has the variables this program captures, with their shapes and dtypes."""
        return all(i < len(state) and variable_spec(state[i]) == spec for i, spec in self.variables.items())

    def scratch(self, scratch: Scratch) -> list:
        """Captured inputs with `scratch`'s zeros standing for the state variables (one per state index,
        made there on first use and shared by every program of the run): a call with them writes no state."""
        return [
            scratch.handle(c, *self.variables[c]) if isinstance(c, int) else const
            for c, const in zip(self.captures, self._constants)
        ]

    def bind(self, state) -> list:
        """The captured inputs for `state` (indexable: the variables the indices name): handles and constants."""
        return [state[c].handle if isinstance(c, int) else const for c, const in zip(self.captures, self._constants)]

    def __call__(self, batch: dict, captured: list) -> dict:
        args = [batch[k] for k in self.inputs] + captured
        outs = self._context.call_function(self.name.encode(), args, len(self.outputs))
        return dict(zip(self.outputs, outs))

    # -- saving --------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write the program to `path`, whole or not at all (`atomic_write`)."""
        meta = {
            "format": FORMAT,
            "name": self.name,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "captures": [c if isinstance(c, int) else None for c in self.captures],
            "variables": {str(i): spec for i, spec in self.variables.items()},
        }
        arrays = {f"const_{i}": np.asarray(c) for i, c in enumerate(self.captures) if not isinstance(c, int)}
        library = [f.SerializeToString() for f in self.library]
        buf = io.BytesIO()
        entries: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
        entries.update({f"function_{i}": np.frombuffer(b, np.uint8) for i, b in enumerate(library)})
        entries.update(arrays)
        np.savez(buf, **entries)  # type: ignore[arg-type]  # numpy's stubs type **kwds as its allow_pickle
        with atomic_write(path) as f:
            f.write(buf.getvalue())


def from_trace(concrete, kind: str, bucket: int, key: str, state: Sequence) -> StepProgram | None:
    """The StepProgram of a traced step (its ConcreteFunction), under its key's names; None when it captures a
    resource that is no state variable (it cannot be bound again)."""
    from tensorflow.core.framework import function_pb2

    handles = {id(v.handle): i for i, v in enumerate(state)}
    captures: list = []
    variables = {}
    for c in concrete.captured_inputs:
        if c.dtype == tf.resource:
            if id(c) not in handles:
                return None
            captures.append(handles[id(c)])
            variables[handles[id(c)]] = variable_spec(state[handles[id(c)]])
        else:
            captures.append(c.numpy())
    library = [f for f in concrete.graph.as_graph_def().library.function]
    main = function_pb2.FunctionDef()
    main.CopyFrom(concrete.function_def)
    structured = concrete.structured_outputs
    if not isinstance(structured, dict):
        return None
    inputs = sorted(concrete.structured_input_signature[0][0])
    outputs = sorted(structured)
    name = f"melshards_{kind}_b{bucket:02d}_{key}"
    library = [_constants_once(f) for f in _renamed([*library, main], main.signature.name, name, key)]
    return StepProgram(name, library, inputs, outputs, captures, variables)


def program_path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, f"{PREFIX}{key}.npz")


def restore(path: str) -> StepProgram | None:
    """The StepProgram saved at `path`; None when there is none. One that does not load is logged and None
    (whether it fits the run's state is `StepProgram.matches`)."""
    if not os.path.exists(path):
        return None
    from tensorflow.core.framework import function_pb2

    try:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')}, not {FORMAT}")
            library = [
                function_pb2.FunctionDef.FromString(z[f"function_{i}"].tobytes())
                for i in range(sum(1 for k in z.files if k.startswith("function_")))
            ]
            captures = [c if c is not None else z[f"const_{i}"] for i, c in enumerate(meta["captures"])]
        os.utime(path)  # its last use, for the cache's trimming
        return StepProgram(meta["name"], library, meta["inputs"], meta["outputs"], captures, meta["variables"])
    except Exception as e:  # noqa: BLE001 (a damaged or foreign file: trace instead)
        log.warning("could not restore the step saved in %s (%s); tracing it instead", path, e)
        return None
