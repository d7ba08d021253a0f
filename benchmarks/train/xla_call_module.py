"""A restored train step's first call in a fresh process: the step as the trainer calls it today against its
StableHLO called through XlaCallModule, with the persistent XLA cache warm for both.

Today the trainer restores a saved train step (train/programs.py: a StepProgram) and calls it; XLA finds
the compiled program in its persistent cache, but only after tf2xla has lowered the step's whole graph to
HLO for the cache key. The alternative measured here (`wrapper`): the step's StableHLO, lowered once, called
from a small jit-compiled function through `XlaCallModule` (it reads the variables the step captures, calls
the module and assigns the updated values back), saved and restored as a StepProgram under a fixed name
(XLA's cache key holds the function's name). Is its first call faster, and does it compute the same bits?

The program: `--program`, else the most recently modified saved train step (a file whose program name
starts with `melshards_train_`) in the persistent cache of `python -m benchmarks.train.compile_wall`. It is
copied into the work dir, and the benchmark keeps its own persistent cache (`<work-dir>/xla-cache`): the
compile_wall cache is only read.

One set-up process (TensorFlow on the CPU): lowers the step to StableHLO (`get_compiler_ir`), rewrites each
`mhlo.copy` (which XlaCallModule refuses) to a `stablehlo.convert` to the same type, serializes the module,
traces and saves the wrapper, then runs each for --steps steps from the same synthetic batch and state, each
on its own copy of the variables: the first calls compile both into the benchmark's cache, and it prints
whether the outputs and variables are bitwise equal after 1 step and after all of them.

Then per round one fresh process (one TensorFlow process at a time): a tiny jit-compiled function first
(XLA's start-up falls on neither variant), then each variant restored and called once on its own copy of
the same state, in turn, the order swapped every other round. Reported per round: each variant's restore
seconds and its first call's wall and CPU seconds (the process's, all threads; the call including the
transfer of its outputs), whether the two gave the same bits, and the entries the process added to the
persistent cache (0: both calls were cache hits); then the medians of the per-round ratios wrapper / today.

This is a measurement, not product code: it uses TensorFlow's private APIs
(`tensorflow.python.eager.context`: `get_compiler_ir`; `tensorflow.compiler.tf2xla.python.xla.call_module`;
`tensorflow.compiler.mlir.stablehlo`'s portable-artifact serializer).

Run: python -m benchmarks.train.xla_call_module [--program PATH] [--rounds 3] [--steps 4] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import child_json, emit
from benchmarks.shards_fixture import REPO
from benchmarks.train.step_device import WORK
from melshards.train.xla_cache import CACHE_FLAG, ENTRY

COMPILE_WALL_CACHE = WORK / "compile-wall" / "xla-cache"  # benchmarks/train/compile_wall.py's cache
SAVED = "melshards_program__*.npz"  # train/programs.py's PREFIX (importing it imports TensorFlow)
TRAIN = "melshards_train_"  # a saved train step's program name starts with this
VARIANTS = ("today", "wrapper")
MLIR_DTYPES = {
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
}


# -- the benchmark process (no TensorFlow) --------------------------------------------------------------
def program_name(path: Path) -> str | None:
    """The program name in a saved StepProgram's meta; None when the file does not read as one."""
    try:
        with np.load(path) as z:
            return json.loads(z["meta"].tobytes())["name"]
    except Exception:  # noqa: BLE001 (a damaged, foreign or half-written file is no candidate)
        return None


def latest_train_step(cache: Path) -> Path | None:
    """The most recently modified saved train step in `cache`; None when there is none."""
    found = [p for p in cache.glob(SAVED) if (program_name(p) or "").startswith(TRAIN)]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def cache_entries(cache: Path) -> int:
    return sum(1 for e in cache.iterdir() if ENTRY.fullmatch(e.name)) if cache.is_dir() else 0


def run_child(work: Path, what: str, *extra: str) -> dict:
    """`python -m benchmarks.train.xla_call_module --child ...` with the benchmark's persistent cache (its
    stderr to `<work>/<what>.log`): the JSON object of its last line. Exits with the log's tail on failure."""
    cmd = [sys.executable, "-m", "benchmarks.train.xla_call_module", "--work-dir", str(work), *extra]
    env = {**os.environ, "TF_XLA_FLAGS": f"{CACHE_FLAG}={work / 'xla-cache'}"}
    return child_json(cmd, env, work / f"{what}.log", REPO)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default=None, help=f"a saved train step (default: the newest in {COMPILE_WALL_CACHE})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="set-up: steps run by each variant for the comparison")
    ap.add_argument("--work-dir", default=str(WORK / "xla-call-module"))
    ap.add_argument("--child", choices=["setup", "round"], help=argparse.SUPPRESS)
    ap.add_argument("--order", default=",".join(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path(args.work_dir)
    if args.child:
        result = setup(work, args.steps) if args.child == "setup" else first_calls(work, args.order.split(","))
        print(json.dumps(result), flush=True)
        return result

    source = Path(args.program) if args.program else latest_train_step(COMPILE_WALL_CACHE)
    if source is None:
        raise SystemExit(
            f"no saved train step in {COMPILE_WALL_CACHE}: run `python -m benchmarks.train.compile_wall "
            "--clips 600 --rounds 1` first, or pass --program PATH"
        )
    name = program_name(source) if source.is_file() else None
    if name is None or not name.startswith(TRAIN):
        raise SystemExit(f"{source} is no saved train step (melshards_program__<key>.npz holding a {TRAIN}* program)")
    cache = work / "xla-cache"
    if cache.resolve() == source.parent.resolve():
        raise SystemExit(
            f"--work-dir {work} would put the benchmark's cache in {cache}, where --program is: pick another"
        )
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, work / "today.npz")
    print(f"program {name} ({source})", flush=True)

    s = run_child(work, "setup", "--child", "setup", "--steps", str(args.steps))
    print(
        f"set-up: {s['nodes']} graph nodes; StableHLO {s['stablehlo_ops']} ops, {s['copies_rewritten']} mhlo.copy "
        f"rewritten, lowered in {s['lower_s']:.2f} s, module {s['module_bytes']} bytes; wrapper {s['wrapper_nodes']} "
        f"nodes; first calls (compile unless the cache had them): today {s['first_call_s']['today']:.2f} s, "
        f"wrapper {s['first_call_s']['wrapper']:.2f} s"
    )
    for when, eq in s["equal"].items():
        print(f"after {when}: outputs bitwise equal {eq['outputs']}, variables bitwise equal {eq['variables']}")
    print(f"the steps changed {s['variables_changed']} variables; last outputs finite: {s['outputs_finite']}")

    def ratio(row: dict, key: str) -> float:
        return row["wrapper"][key] / row["today"][key]

    print(
        "round  order          | today: restore  call wall  call cpu | wrapper: restore  call wall  call cpu "
        "| wrapper/today: wall   cpu | same bits  new cache entries"
    )
    rows = []
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        before = cache_entries(cache)
        row = run_child(work, f"round-{r + 1}", "--child", "round", "--order", ",".join(order))
        row.update(round=r + 1, order=order, new_cache_entries=cache_entries(cache) - before)
        rows.append(row)
        t, w = row["today"], row["wrapper"]
        print(
            f"{row['round']:5d}  {','.join(order):<13}  {t['restore_s']:16.3f}  {t['first_call_s']:9.3f}"
            f"  {t['first_call_cpu_s']:8.3f}  {w['restore_s']:18.3f}  {w['first_call_s']:9.3f}"
            f"  {w['first_call_cpu_s']:8.3f}  {ratio(row, 'first_call_s'):19.3f}  {ratio(row, 'first_call_cpu_s'):5.3f}"
            f"  {str(row['same_bits']):>11}  {row['new_cache_entries']:17d}",
            flush=True,
        )

    def total(row: dict, v: str) -> float:
        return row[v]["restore_s"] + row[v]["first_call_s"]

    first_call = statistics.median(ratio(row, "first_call_s") for row in rows)
    restore_and_call = statistics.median(total(row, "wrapper") / total(row, "today") for row in rows)
    first_call_cpu = statistics.median(ratio(row, "first_call_cpu_s") for row in rows)
    print(f"first call, wrapper / today, median of per-round ratios: wall {first_call:.3f}, CPU {first_call_cpu:.3f}")
    print(f"restore + first call, wrapper / today, median of per-round ratios: {restore_and_call:.3f}")
    result = {
        "benchmark": "xla_call_module",
        "host_cores": os.cpu_count(),
        "program": name,
        "steps": args.steps,
        "setup": s,
        "rounds": rows,
        "bitwise_equal": all(eq["outputs"] and eq["variables"] for eq in s["equal"].values())
        and all(row["same_bits"] for row in rows),
        "wrapper_over_today_first_call": round(first_call, 3),
        "wrapper_over_today_first_call_cpu": round(first_call_cpu, 3),
        "wrapper_over_today_restore_and_call": round(restore_and_call, 3),
    }
    emit(result)
    return result


# -- the TensorFlow processes ---------------------------------------------------------------------------
def warm_up() -> None:
    """One tiny jit-compiled call, so that XLA's start-up in this process falls on neither variant."""
    from melshards.train.tf_quiet import tf

    @tf.function(jit_compile=True)
    def tiny(x):
        return x * 2.0 + 1.0

    tiny(tf.ones([3])).numpy()


def synthetic_batch(inputs: dict, seed: int) -> dict:
    """A batch for the step's input specs ({name: (shape, dtype name)}): random floats, each `<x>_len` 3/4
    of its `<x>...` input's length axis, `text_ids` random in [1, 30), other integers 0."""
    from melshards.train.tf_quiet import tf

    out = {}
    for n, (k, (shape, dtype)) in enumerate(sorted(inputs.items())):
        d = tf.as_dtype(dtype)
        if d.is_floating:
            out[k] = tf.random.stateless_uniform(shape, [seed, n], dtype=d)
        elif k.endswith("_len"):
            data = [s for name, (s, _) in sorted(inputs.items()) if name.startswith(k[:-4]) and name != k]
            size = data[0][len(shape)] if data else 1
            out[k] = tf.fill(shape, tf.constant(max(1, size * 3 // 4), d))
        elif k == "text_ids":
            out[k] = tf.random.stateless_uniform(shape, [seed, n], 1, 30, dtype=d)
        else:
            out[k] = tf.zeros(shape, d)
    return out


def synthetic_state(variables: dict) -> dict:
    """{index: variable} for a program's captured variables ({index: (shape, dtype name)}): floats random in
    [0, 0.1), the same every call; integers 0."""
    from melshards.train.tf_quiet import tf

    state = {}
    for i, (shape, dtype) in sorted((int(i), spec) for i, spec in variables.items()):
        d = tf.as_dtype(dtype)
        value = tf.random.stateless_uniform(shape, [3, i], 0.0, 0.1, dtype=d) if d.is_floating else tf.zeros(shape, d)
        state[i] = tf.Variable(value, trainable=False)
    return state


def callable_module(text: str, n_outputs: int) -> tuple[bytes, dict]:
    """The step's StableHLO text as XlaCallModule takes it: each `mhlo.copy` made a `stablehlo.convert` (to the
    same type), serialized; and what calling it needs: the result shapes and dtypes (`outs`), and which
    parameter each result after the step's `n_outputs` outputs updates (`updates`: {result: parameter})."""
    from tensorflow.compiler.mlir.stablehlo import stablehlo

    copies = len(re.findall(r"\bmhlo\.copy\b", text))
    fixed = re.sub(r"\bmhlo\.copy\b", "stablehlo.convert", text)
    left = sorted(set(re.findall(r"= \"?(mhlo\.[a-z_]+)", fixed)))  # ops (`mhlo.<attribute> =` are no ops)
    if left:
        raise SystemExit(f"the StableHLO holds MHLO ops XlaCallModule may refuse: {left}")
    sig = re.search(r"func\.func (?:public )?@main\((.*?)\) -> \((.*?)\) \{", fixed, re.S)
    if sig is None:
        raise SystemExit("no @main function in the lowered StableHLO")
    outs = []
    for dims, ty in re.findall(r"tensor<((?:\d+x)*)([a-z0-9]+)>", sig.group(2)):
        outs.append(([int(x) for x in dims.split("x") if x], MLIR_DTYPES[ty]))
    aliases = re.findall(r"parameter_number = (\d+) : i64\}, output_index = array<i64: (\d+)>", fixed)
    updates = {int(o): int(p) for p, o in aliases}
    if len(outs) != n_outputs + len(updates) or sorted(updates) != list(range(n_outputs, len(outs))):
        raise SystemExit(
            f"{len(outs)} results, {n_outputs} outputs and {len(updates)} aliased parameters do not add up"
        )
    module = stablehlo.serialize_portable_artifact_str(fixed, stablehlo.get_current_version())
    info = {
        "outs": outs,
        "updates": updates,
        "parameters": sig.group(1).count("%arg"),
        "stablehlo_ops": len(re.findall(r"\bstablehlo\.[a-z_]+", fixed)),
        "copies_rewritten": copies,
        "module_bytes": len(module),
    }
    return module, info


def wrapper_program(p, module: bytes, info: dict, state: dict, batch: dict):
    """The StepProgram of a jit-compiled function that calls `module` (`p`'s step) through XlaCallModule with
    the batch and `p`'s captured inputs, assigns the updated variables and returns `p`'s outputs; named after
    `p` (`melshards_wrapped_b<bucket>_<key>x`), so every process calls it under the same name."""
    from tensorflow.compiler.tf2xla.python import xla

    from melshards.train.programs import from_trace
    from melshards.train.tf_quiet import tf

    n_in = len(p.inputs)
    constants = [None if isinstance(c, int) else tf.constant(c) for c in p.captures]
    if info["parameters"] != n_in + len(p.captures):
        raise SystemExit(f"the module takes {info['parameters']} parameters, not {n_in} inputs + {len(p.captures)}")
    if any(prm < n_in or not isinstance(p.captures[prm - n_in], int) for prm in info["updates"].values()):
        raise SystemExit("the module updates a parameter that is no captured variable")

    @tf.function(jit_compile=True)
    def step(b):
        params = [b[k] for k in p.inputs]
        params += [state[c].read_value() if isinstance(c, int) else k for c, k in zip(p.captures, constants)]
        res = xla.call_module(
            params,
            version=xla.call_module_maximum_supported_version(),
            module=module,
            Tout=[tf.as_dtype(d) for _, d in info["outs"]],
            Sout=[s for s, _ in info["outs"]],
            platforms=["CPU"],
        )
        for o, prm in info["updates"].items():
            state[p.captures[prm - n_in]].assign(res[o])
        return dict(zip(p.outputs, res[: len(p.outputs)]))

    concrete = step.get_concrete_function(batch)
    spare = tf.Variable(0, trainable=False)  # stands for the state indices p does not capture
    slots = [state.get(i, spare) for i in range(max(state) + 1)]
    bucket, key = re.fullmatch(TRAIN + r"b(\d+)_(\w+)", p.name).groups()  # type: ignore[union-attr]
    wrapped = from_trace(concrete, "wrapped", int(bucket), key + "x", slots)
    if wrapped is None:
        raise SystemExit("the wrapper captures something that is no variable of the step")
    return wrapped


def outputs_of(out: dict) -> dict:
    return {k: v.numpy() for k, v in out.items()}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def setup(work: Path, steps: int) -> dict:
    """The set-up process (module docstring): lowers, saves the wrapper, compiles both, compares them."""
    from tensorflow.python.eager import context as eager

    from melshards.train.programs import restore
    from melshards.train.tf_quiet import tf

    warm_up()
    p = restore(str(work / "today.npz"))
    if p is None:
        raise SystemExit(f"{work / 'today.npz'} did not restore (see the warning above)")
    main = next(f for f in p.library if f.signature.name == p.name)
    inputs = {}
    for i, k in enumerate(p.inputs):
        shape = main.arg_attr[i].attr["_output_shapes"].list.shape[0]
        inputs[k] = ([d.size for d in shape.dim], tf.as_dtype(main.signature.input_arg[i].type).name)
    batch = synthetic_batch(inputs, 0)
    state = synthetic_state(p.variables)
    t = time.perf_counter()
    text = eager.context().get_compiler_ir(
        device_name=None,
        platform_name="CPU",
        function_name=p.name,
        flat_args=[batch[k] for k in p.inputs],
        captured_inputs=p.bind(state),
        stage="stablehlo",
    )
    lower_s = time.perf_counter() - t
    module, info = callable_module(text.decode() if isinstance(text, bytes) else text, len(p.outputs))
    wrapped = wrapper_program(p, module, info, state, batch)
    wrapped.save(str(work / "wrapper.npz"))

    programs = {"today": p, "wrapper": wrapped}
    states = {v: synthetic_state(p.variables) for v in VARIANTS}
    first_call_s, outs, equal = {}, {}, {}
    for step in range(steps):
        b = synthetic_batch(inputs, step)
        for v in VARIANTS:
            t = time.perf_counter()
            outs[v] = outputs_of(programs[v](b, programs[v].bind(states[v])))
            if step == 0:
                first_call_s[v] = round(time.perf_counter() - t, 3)
        if step in (0, steps - 1):
            variables = {v: {str(i): x.numpy() for i, x in states[v].items()} for v in VARIANTS}
            equal[f"{step + 1} step{'s' if step else ''}"] = {
                "outputs": same_bits(outs["today"], outs["wrapper"]),
                "variables": same_bits(variables["today"], variables["wrapper"]),
            }
    start = {i: x.numpy().tobytes() for i, x in synthetic_state(p.variables).items()}
    changed = sum(states["today"][i].numpy().tobytes() != b for i, b in start.items())
    finite = all(np.isfinite(x).all() for x in outs["today"].values() if x.dtype.kind == "f")
    spec = {"inputs": inputs, "variables": p.variables, "today": str(work / "today.npz")}
    (work / "setup.json").write_text(json.dumps({**spec, "wrapper": str(work / "wrapper.npz")}))
    return {
        "nodes": sum(len(f.node_def) for f in p.library),
        "wrapper_nodes": sum(len(f.node_def) for f in wrapped.library),
        "lower_s": round(lower_s, 3),
        **{k: info[k] for k in ("stablehlo_ops", "copies_rewritten", "module_bytes")},
        "first_call_s": first_call_s,
        "equal": equal,
        "variables_changed": f"{changed} of {len(start)}",
        "outputs_finite": bool(finite),
    }


def first_calls(work: Path, order: list[str]) -> dict:
    """A round's process (module docstring): each variant restored and called once, in `order`."""
    from melshards.train.programs import restore

    spec = json.loads((work / "setup.json").read_text())
    warm_up()
    batch = synthetic_batch(spec["inputs"], 0)
    row: dict = {}
    outs, variables = {}, {}
    for v in order:
        state = synthetic_state(spec["variables"])
        t = time.perf_counter()
        program = restore(spec[v])
        if program is None:
            raise SystemExit(f"{spec[v]} did not restore (see the warning above)")
        t1, cpu = time.perf_counter(), time.process_time()
        outs[v] = outputs_of(program(batch, program.bind(state)))
        t2, cpu = time.perf_counter(), time.process_time() - cpu
        variables[v] = {str(i): x.numpy() for i, x in state.items()}
        row[v] = {"restore_s": round(t1 - t, 3), "first_call_s": round(t2 - t1, 3), "first_call_cpu_s": round(cpu, 3)}
    row["same_bits"] = same_bits(outs["today"], outs["wrapper"]) and same_bits(variables["today"], variables["wrapper"])
    return row


if __name__ == "__main__":
    main()
