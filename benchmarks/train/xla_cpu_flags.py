"""A restored train step under XLA:CPU settings given as environment variables (XLA_FLAGS, GLIBC_TUNABLES, ...),
side by side in fresh processes: its cold compile, its first call with the program in the persistent cache
(what a resumed run's first step waits for, train/compile.py), and its steady step.

Variants (`--variant NAME:VAR=VALUE ...`, repeatable; the first is the reference): each child process gets
this process's environment with the variant's assignments over it. The default pair is `default:` (no
change) and `no-ynn:XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=` (XLA:CPU leaves the dots it would
hand to YNNPACK to its own emitters). TensorFlow's persistent cache keys an entry by the function and its
HLO, not by the XLA flags, so a cache filled under one variant's flags would serve another its programs:
each variant gets a persistent cache of its own, filled by one child before the rounds.

The program: `--program`, else the most recently modified saved train step in the persistent cache of
`python -m benchmarks.train.compile_wall` (train/programs.py's `melshards_program__<key>.npz`; only read).
Each child warms XLA up with a tiny jit-compiled call, restores the program, makes a synthetic batch and
state (the same in every child: `xla_call_module.synthetic_batch` and `synthetic_state`) and calls it.

Per round, each variant in turn (the order reversed every other round): a cold child (a new, empty
persistent cache: the lowering, XLA's compile and the first run) and a warm child (the variant's filled
cache: the lowering, the cached executable's load and its first run, then `--steps` more calls). Reported:
each call's wall and CPU seconds (the process's, all threads), the steady step's CPU and wall milliseconds
per call (median wall), the cache entries each child added (1 cold, 0 warm), whether the outputs are finite,
and the largest relative difference of each output after the first call and after the last from the
reference variant's; then per variant the medians, and the medians of the per-round differences from the
reference.

Run: python -m benchmarks.train.xla_cpu_flags [--program PATH] [--rounds 5] [--steps 200] [--work-dir DIR]
     [--variant NAME:VAR=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import child_json, emit
from benchmarks.shards_fixture import REPO
from benchmarks.train.step_device import WORK
from benchmarks.train.xla_call_module import (
    COMPILE_WALL_CACHE,
    TRAIN,
    cache_entries,
    latest_train_step,
    program_name,
)
from melshards.train.xla_cache import CACHE_FLAG

DEFAULT_VARIANTS = ("default:", "no-ynn:XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=")


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME:VAR=VALUE VAR=VALUE ...` as (name, {VAR: VALUE}); a value may hold `=`."""
    name, _, assignments = spec.partition(":")
    env = {}
    for item in assignments.split():
        var, eq, value = item.partition("=")
        if not eq or not var:
            raise SystemExit(f"--variant {spec!r}: {item!r} is no VAR=VALUE")
        env[var] = value
    if not name:
        raise SystemExit(f"--variant {spec!r} has no name: write NAME:VAR=VALUE ...")
    return name, env


# -- the TensorFlow child -------------------------------------------------------------------------------
def child(program: str, steps: int) -> dict:
    """One process's calls of the program (this process's TF_XLA_FLAGS name its persistent cache)."""
    import numpy as np

    from benchmarks.train.xla_call_module import synthetic_batch, synthetic_state, warm_up
    from melshards.train.programs import restore
    from melshards.train.tf_quiet import reading_xla_cache, tf

    warm_up()
    cache = Path(os.environ["TF_XLA_FLAGS"].split("=", 1)[1])
    before = cache_entries(cache)
    p = restore(program)
    main = next(f for f in p.library if f.signature.name == p.name)
    inputs = {
        k: (
            [d.size for d in main.arg_attr[i].attr["_output_shapes"].list.shape[0].dim],
            main.signature.input_arg[i].type,
        )
        for i, k in enumerate(p.inputs)
    }
    batch = synthetic_batch({k: (shape, tf.as_dtype(t).name) for k, (shape, t) in inputs.items()}, seed=1)
    state = synthetic_state(p.variables)
    captured = p.bind(state)

    def floats(out: dict) -> dict:
        """Each floating output's values (as float64 lists), read back to the host."""
        return {k: v.numpy().astype(np.float64).ravel().tolist() for k, v in out.items() if v.dtype.is_floating}

    wall, cpu = time.perf_counter(), time.process_time()
    with reading_xla_cache():
        first = floats(p(batch, captured))
    first_wall, first_cpu = time.perf_counter() - wall, time.process_time() - cpu
    last, walls = first, []
    cpu = time.process_time()
    for _ in range(steps):
        wall = time.perf_counter()
        last = floats(p(batch, captured))
        walls.append(time.perf_counter() - wall)
    step_cpu = (time.process_time() - cpu) / steps if steps else None
    return {
        "first_call_s": first_wall,
        "first_call_cpu_s": first_cpu,
        "step_ms": statistics.median(walls) * 1e3 if walls else None,
        "step_cpu_ms": step_cpu * 1e3 if step_cpu is not None else None,
        "entries_added": cache_entries(cache) - before,
        "finite": bool(all(np.isfinite(v).all() for v in last.values())),
        "first": first,
        "last": last,
    }


# -- the benchmark process (no TensorFlow) --------------------------------------------------------------
def run_child(work: Path, program: Path, cache: Path, env: dict, steps: int, what: str) -> dict:
    """A child process with `env` over this one's and its persistent cache in `cache` (stderr to
    `<work>/<what>.log`): the JSON object of its last line. Exits with the log's tail on failure."""
    cmd = [sys.executable, "-m", "benchmarks.train.xla_cpu_flags", "--child", str(program), "--steps", str(steps)]
    full = {**os.environ, **env, "TF_XLA_FLAGS": f"{CACHE_FLAG}={cache}"}
    return child_json(cmd, full, work / f"{what}.log", REPO)


def max_rel_diff(a: dict, b: dict) -> float:
    """The largest |a - b| / max(|b|, 1e-12) over every element of every output both have."""
    worst = 0.0
    for k in a.keys() & b.keys():
        for x, y in zip(a[k], b[k]):
            if x != y:
                worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    return worst


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default=None, help=f"a saved train step (default: the newest in {COMPILE_WALL_CACHE})")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="calls after the first in each warm child")
    ap.add_argument("--work-dir", default=str(WORK / "xla-cpu-flags"))
    ap.add_argument("--variant", action="append", help="NAME:VAR=VALUE ... (repeatable; the first is the reference)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        result = child(args.child, args.steps)
        print(json.dumps(result), flush=True)
        return result

    if args.steps < 1 or args.rounds < 1:
        raise SystemExit("--steps and --rounds take 1 or more")
    variants = dict(parse_variant(s) for s in (args.variant or DEFAULT_VARIANTS))
    source = Path(args.program) if args.program else latest_train_step(COMPILE_WALL_CACHE)
    if source is None:
        raise SystemExit(
            f"no saved train step in {COMPILE_WALL_CACHE}: run `python -m benchmarks.train.compile_wall "
            "--clips 600 --rounds 1` first, or pass --program PATH"
        )
    if not source.is_file() or not (program_name(source) or "").startswith(TRAIN):
        raise SystemExit(f"{source} is no saved train step (melshards_program__<key>.npz holding a {TRAIN}* program)")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix="run-", dir=work))  # every cache of this run, removed at its end
    try:
        caches = {name: made / f"cache-{name}" for name in variants}
        for name, env in variants.items():  # fill each variant's cache under its own flags
            caches[name].mkdir()
            run_child(work, source, caches[name], env, 0, f"fill-{name}")
        rows, reference = [], next(iter(variants))
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            row: dict = {"round": r + 1, "order": order}
            for name in order:
                cold = Path(tempfile.mkdtemp(prefix=f"cold-{name}-", dir=made))
                c = run_child(work, source, cold, variants[name], 0, f"cold-{name}")
                shutil.rmtree(cold)
                w = run_child(work, source, caches[name], variants[name], args.steps, f"warm-{name}")
                row[name] = {"cold": c, "warm": w}
            ref = row[reference]
            for name in variants:
                v = row[name]
                print(
                    f"round {r + 1} {name:>12}: cold first call {v['cold']['first_call_s']:.2f} s "
                    f"(CPU {v['cold']['first_call_cpu_s']:.2f}, {v['cold']['entries_added']} added), warm "
                    f"{v['warm']['first_call_s']:.3f} s (CPU {v['warm']['first_call_cpu_s']:.3f}, "
                    f"{v['warm']['entries_added']} added), step {v['warm']['step_ms']:.2f} ms "
                    f"(CPU {v['warm']['step_cpu_ms']:.2f}), finite {v['warm']['finite']}, rel. diff first "
                    f"{max_rel_diff(v['warm']['first'], ref['warm']['first']):.1e} last "
                    f"{max_rel_diff(v['warm']['last'], ref['warm']['last']):.1e}",
                    flush=True,
                )
            rows.append(row)
    finally:
        shutil.rmtree(made, ignore_errors=True)

    figures = {
        "cold_first_call_cpu_s": lambda v: v["cold"]["first_call_cpu_s"],
        "cold_first_call_s": lambda v: v["cold"]["first_call_s"],
        "warm_first_call_cpu_s": lambda v: v["warm"]["first_call_cpu_s"],
        "warm_first_call_s": lambda v: v["warm"]["first_call_s"],
        "step_cpu_ms": lambda v: v["warm"]["step_cpu_ms"],
        "step_ms": lambda v: v["warm"]["step_ms"],
    }
    summary: dict = {}
    for name in variants:
        s = {k: statistics.median(f(row[name]) for row in rows) for k, f in figures.items()}
        if name != reference:
            for k, f in figures.items():
                s[f"{k}_minus_{reference}"] = statistics.median(f(row[name]) - f(row[reference]) for row in rows)
            s["max_rel_diff_last"] = max(
                max_rel_diff(row[name]["warm"]["last"], row[reference]["warm"]["last"]) for row in rows
            )
        s["finite"] = all(row[name]["warm"]["finite"] for row in rows)
        summary[name] = s
        print(f"{name}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items()))
    for row in rows:
        for name in variants:
            for kind in ("cold", "warm"):
                del row[name][kind]["first"], row[name][kind]["last"]
    result = {"program": str(source), "variants": variants, "rounds": rows, "summary": summary}
    emit(result)
    return result


if __name__ == "__main__":
    main()
