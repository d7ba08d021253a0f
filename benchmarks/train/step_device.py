"""The train step on the device this machine has: `melshards train` variants side by side, and the host's
parse-only throughput per core.

Variants (each its own process over the same shards, a `melshards train` or, for `before`, a Python child;
rounds interleave them):

  bf16        the built-in model at configs/train_base.yaml sizes as shipped: mixed_bfloat16, XLA
  fp32        the same in float32
  bf16_noxla  mixed_bfloat16, loop.jit_compile: false (TensorFlow's own kernels)
  synthetic   bf16 with --synthetic-data: one constant batch per bucket, the input pipeline's upper bound
  before      the loader melshards replaces (benchmarks/train/before_after.py): numpy_function decode + librosa
              log-mel per clip, padded_batch with None shapes, a tf.function step without signature or
              XLA, float32, dropout off (its only variant without the trainer's loop)

Per variant: steady step time and examples/s, valid mel frames/s, input wait share, compile seconds per
bucket (trace + XLA compile, up front), time to the first step, train-step traces, and on an NVIDIA GPU
(NVML, nvidia-ml-py) the mean device utilisation over the steady part and the peak device memory;
those two are null elsewhere. The device, the host's cores and the layer choices (train/device.py)
head the table. Then parse-only throughput: the trainer's tf.data chain (read, shuffle, parse, batch)
with no step, on one core (tf.data's private thread pool of 1) and on all, as records/s and mel
frames/s (valid and padded), and the host cores one GPU needs at the DeepLearningExamples FastPitch
rate (148k output mel frames/s on one A100 80GB, AMP).

Run: python -m benchmarks.train.step_device [--quick] [--rounds 1] [--steps 60] [--shards DIR] [--variants ...]
  --quick: the tests' tiny model, 8 steps, the demo shards: the whole thing in a few minutes on 2 CPU cores.
  Full: train_base sizes, batch 32, on shards of --clips synthetic LJSpeech-like clips (generated, then
  preprocessed with configs/ljspeech.yaml), one round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import emit, melshards_train, preprocess_command
from benchmarks.shards_fixture import REPO, demo_shards

VARIANTS = ("bf16", "fp32", "bf16_noxla", "synthetic", "before")
FASTPITCH_FRAMES_PER_S = 148_000  # DeepLearningExamples FastPitch, one A100 80GB, AMP: output mel frames/s
QUICK_MODEL = {
    "d_model": 32,
    "num_heads": 2,
    "ff_dim": 64,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_conv_layers": 1,
    "prenet_dim": 32,
    "postnet_channels": 32,
    "postnet_layers": 1,
    "reduction_factor": 4,
}
WORK = Path(os.environ.get("MELSHARDS_BENCH_DIR", "/tmp/melshards-bench"))


class Nvml:
    """Device utilisation and memory sampled every 0.1 s through NVML; `available` False (every figure None)
    without nvidia-ml-py or an NVIDIA driver."""

    def __init__(self):
        self.available, self.samples, self._stop = False, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self._handle)
            self.available = True
        except Exception:  # noqa: BLE001 (no package, no driver, no device: the figures are null)
            self.name = None

    def __enter__(self):
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.1):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used
            self.samples.append((time.perf_counter(), util, used))

    def __exit__(self, *exc):
        self._stop.set()
        if self.available:
            self._thread.join()

    def figures(self, steady_from: float) -> dict:
        """Mean utilisation (%) from `steady_from` on, and the peak memory (GiB) of the whole run."""
        if not self.available or not self.samples:
            return {"device_util_percent": None, "peak_device_memory_gib": None}
        steady = [u for t, u, _ in self.samples if t >= steady_from] or [u for _, u, _ in self.samples]
        return {
            "device_util_percent": round(statistics.mean(steady), 1),
            "peak_device_memory_gib": round(max(m for _, _, m in self.samples) / 2**30, 2),
        }


def device_name() -> str:
    """What the step runs on: the GPU's name, or the CPU's model and core count."""
    nvml = Nvml()
    if nvml.name:
        return f"{nvml.name} (GPU)"
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "CPU",
        )
        if Path("/proc/cpuinfo").exists()
        else "CPU"
    )
    return f"{model}, {os.cpu_count()} cores (CPU)"


def config_for(variant: str, quick: bool, steps: int, path: Path) -> Path:
    """configs/train_base.yaml (the tests' tiny model with --quick) for `steps` steps, no mid-run checkpoint
    or validation, and the variant's jit_compile."""
    cfg = yaml.safe_load((REPO / "configs" / "train_base.yaml").read_text())
    k = 1 if quick else cfg["loop"]["steps_per_execution"]
    cfg["loop"].update(
        steps=steps,
        steps_per_execution=k,
        checkpoint_every=steps,
        log_every=k,
        val_every=steps,
        jit_compile=variant != "bf16_noxla",
    )
    if quick:
        cfg["model"] = dict(QUICK_MODEL)
        cfg["data"].update(batch_size=8, shuffle_buffer=64, cycle_length=2)
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_variant(variant: str, shards: Path, work: Path, quick: bool, steps: int) -> dict:
    """One `melshards train` process; its run_summary.json figures plus NVML's."""
    model_dir = work / f"model-{variant}"
    shutil.rmtree(model_dir, ignore_errors=True)
    cfg = config_for(variant, quick, steps, work / f"{variant}.yaml")
    precision = "float32" if variant == "fp32" else "mixed_bfloat16"
    with Nvml() as nvml:  # MELSHARDS_XLA_CACHE empty: every variant compiles, compile seconds are the cold ones
        s = melshards_train(
            shards,
            model_dir,
            cfg,
            "--precision",
            precision,
            *(["--synthetic-data"] if variant == "synthetic" else []),
            env={"MELSHARDS_XLA_CACHE": ""},
        )
        ended = time.perf_counter()
    st = s["steady_state"]
    steady_s = st["calls"] * s["steps_per_execution"] / st["steps_per_second"] if st["steps_per_second"] else 0.0
    return {
        "step_ms": 1000.0 / st["steps_per_second"] if st["steps_per_second"] else None,
        "examples_per_s": st["examples_per_second"],
        "mel_frames_per_s": st["mel_frames_per_second"],
        "input_wait": st["input_wait_fraction"],
        "compile_s_by_bucket": {
            str(p["bucket"]): round(p["trace_s"] + p["compile_s"], 1)
            for p in s.get("programs", [])
            if p["kind"] == "train"
        },
        "time_to_first_step_s": s["time_to_first_step"],
        "traces": s["train_step_traces"],
        "buckets": len(s["buckets"]),
        "layers": s["layers"],
        **nvml.figures(ended - steady_s),
    }


def before_loader(shards: str, config: str, steps: int) -> dict:
    """benchmarks/train/before_after.py's `before` variant (its classic loader and plain step) for `steps` steps
    on the clips the shards at `shards` hold: run_variant's figures. What before_variant's child runs."""
    from benchmarks.train.before_after import _kept_clips, run_variant

    return run_variant("before", Path(shards), _kept_clips(Path(shards)), config, steps)


def in_fresh_process(function: str, *args: Any) -> Any:
    """`function(*args)` of this module run in a child Python process (a fresh import of everything it
    uses, TensorFlow's state included); what it returned, through JSON. A failing child stops the
    benchmark with the tail of its stderr."""
    code = (
        "import json, sys; from benchmarks.train import step_device; "
        "print(json.dumps(getattr(step_device, sys.argv[1])(*json.loads(sys.argv[2]))))"
    )
    argv = [sys.executable, "-c", code, function, json.dumps(args)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"step_device.{function} failed in its child process:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def before_variant(shards: Path, quick: bool, steps: int, work: Path) -> dict:
    """`before_loader` in a child process (a fresh TensorFlow, as each trainer variant has); its figures
    plus NVML's."""
    cfg = config_for("fp32", quick, steps, work / "before.yaml")
    with Nvml() as nvml:
        out = in_fresh_process("before_loader", str(shards), str(cfg), steps)
        ended = time.perf_counter()
    steady_s = (steps - 1) / out["steady_steps_per_s"]
    return {
        "step_ms": 1000.0 / out["steady_steps_per_s"],
        "examples_per_s": out["steady_examples_per_s"],
        "mel_frames_per_s": out["steady_mel_frames_per_s"],
        "input_wait": out["input_wait"],
        "compile_s_by_bucket": None,
        "time_to_first_step_s": out["first_call_s"],
        "traces": out["traces"],
        "buckets": None,
        "layers": None,
        **nvml.figures(ended - steady_s),
    }


def parse_only(shards: Path, batch_size: int, seconds: float) -> dict:
    """The trainer's input chain with no step, on 1 core and on all: records/s and mel frames/s."""
    from melshards.shards_schema import read_schema
    from melshards.train import input_pipeline
    from melshards.train.config import DataConfig
    from melshards.train.step import MODEL_INPUTS
    from melshards.train.tf_quiet import tf

    schema = read_schema(str(shards))
    bucket = schema.buckets[-1]  # the longest records: the most bytes parsed per record
    files = input_pipeline.expand_globs([str(shards / f"train-b{bucket.index:02d}-*.tfrecord")])
    data = dataclasses.replace(DataConfig(), batch_size=batch_size, shuffle_buffer=256)
    out = {}
    for cores in (1, os.cpu_count() or 1):
        ds = input_pipeline.train_dataset(files, bucket, data, MODEL_INPUTS, 1)
        options = tf.data.Options()
        options.threading.private_threadpool_size = cores
        options.threading.max_intra_op_parallelism = 1
        it = iter(ds.with_options(options))
        next(it)  # warm-up: open files, fill the shuffle buffer
        records = frames = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batch = next(it)
            records += int(tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.int32)))
            frames += int(tf.reduce_sum(batch["mel_len"]))
        wall = time.perf_counter() - t0
        out[f"{cores}_core" + ("s" if cores > 1 else "")] = {
            "records_per_s": round(records / wall, 1),
            "valid_mel_frames_per_s": round(frames / wall),
            "padded_mel_frames_per_s": round(records * bucket.max_mel_frames / wall),
        }
    one = out["1_core"]["valid_mel_frames_per_s"]
    out["cores_per_gpu_at_fastpitch_rate"] = round(FASTPITCH_FRAMES_PER_S / one, 2) if one else None
    out["bucket"] = {"max_mel_frames": bucket.max_mel_frames, "max_text_len": bucket.max_text_len}
    return out


def benchmark_shards(args) -> Path:
    """--shards, else the demo shards (--quick), else --clips generated clips preprocessed with configs/ljspeech.yaml."""
    if args.shards:
        return Path(args.shards)
    if args.quick:
        return demo_shards(str(WORK / "step-device" / "demo-shards"))
    out = WORK / "step-device" / f"shards-{args.clips}"
    if not (out / "schema.json").exists():
        from benchmarks.preprocess.scale import ensure_corpus

        corpus = ensure_corpus(str(WORK / f"ljbig-{args.clips}"), args.clips)
        command = preprocess_command(corpus, out, "--config", str(REPO / "configs" / "ljspeech.yaml"))
        code = subprocess.run(command, cwd=REPO).returncode
        if code:
            raise SystemExit(f"preprocessing {corpus} failed ({code})")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 steps, demo shards: minutes on 2 CPU cores")
    ap.add_argument("--steps", type=int, default=None, help="steps per variant (default 8 quick, 120 full)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clips", type=int, default=2000, help="size of the generated corpus (full run)")
    ap.add_argument("--shards", default=None, help="existing melshards shards to train on instead")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--parse-seconds", type=float, default=None, help="per parse-only measurement (2 quick, 10 full)")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variants {sorted(set(variants) - set(VARIANTS))}; choose from {', '.join(VARIANTS)}")
    steps = args.steps or (8 if args.quick else 120)
    shards = benchmark_shards(args)
    work = WORK / "step-device"
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            out = (
                before_variant(shards, args.quick, steps, work)
                if v == "before"
                else train_variant(v, shards, work, args.quick, steps)
            )
            runs[v].append(out)
            print(
                f"round {r + 1} {v:<11} step {out['step_ms']:.1f} ms, {out['mel_frames_per_s']:.0f} mel frames/s, "
                f"input wait {100 * out['input_wait']:.1f}%",
                flush=True,
            )
    batch = (
        8 if args.quick else yaml.safe_load((REPO / "configs" / "train_base.yaml").read_text())["data"]["batch_size"]
    )
    parse = parse_only(shards, batch, args.parse_seconds or (2.0 if args.quick else 10.0))
    median = {v: median_of(rs) for v, rs in runs.items()}
    result = {
        "benchmark": "step_device",
        "device": device_name(),
        "host_cores": os.cpu_count(),
        "quick": args.quick,
        "steps": steps,
        "rounds": args.rounds,
        "shards": str(shards),
        "variants": median,
        "parse_only": parse,
    }
    if "bf16" in median and "synthetic" in median and median["synthetic"]["examples_per_s"]:
        result["real_over_synthetic"] = round(
            median["bf16"]["examples_per_s"] / median["synthetic"]["examples_per_s"], 3
        )
    print_table(result)
    emit(result)
    return result


def median_of(rounds: list[dict]) -> dict:
    """Per figure, the median over the rounds (numbers), else the first round's value."""
    out = {}
    for key, value in rounds[0].items():
        nums = [r[key] for r in rounds if isinstance(r[key], (int, float)) and r[key] is not None]
        out[key] = statistics.median(nums) if isinstance(value, (int, float)) and nums else value
    return out


def print_table(result: dict) -> None:
    def fmt(v, spec):
        return "null" if v is None else format(v, spec)

    print(
        f"\n{result['device']}; layers {next((m['layers'] for m in result['variants'].values() if m['layers']), None)}"
    )
    print(
        f"{'variant':<11} {'step ms':>8} {'ex/s':>8} {'mel fr/s':>10} {'wait %':>7} {'1st step s':>10} "
        f"{'traces':>6} {'util %':>7} {'peak GiB':>8}  compile s by bucket"
    )
    for v, m in result["variants"].items():
        print(
            f"{v:<11} {fmt(m['step_ms'], '.1f'):>8} {fmt(m['examples_per_s'], '.1f'):>8} "
            f"{fmt(m['mel_frames_per_s'], '.0f'):>10} {fmt(None if m['input_wait'] is None else 100 * m['input_wait'], '.1f'):>7} "
            f"{fmt(m['time_to_first_step_s'], '.1f'):>10} {fmt(m['traces'], 'd'):>6} "
            f"{fmt(m['device_util_percent'], '.1f'):>7} {fmt(m['peak_device_memory_gib'], '.2f'):>8}  "
            f"{m['compile_s_by_bucket']}"
        )
    p = result["parse_only"]
    for key in ("1_core", f"{result['host_cores']}_cores"):
        if key in p:
            print(
                f"parse only, {key.replace('_', ' ')}: {p[key]['records_per_s']} records/s, "
                f"{p[key]['valid_mel_frames_per_s']} valid mel frames/s ({p[key]['padded_mel_frames_per_s']} padded)"
            )
    print(
        f"host cores per GPU at FastPitch's {FASTPITCH_FRAMES_PER_S} mel frames/s: "
        f"{p['cores_per_gpu_at_fastpitch_rate']}"
    )


if __name__ == "__main__":
    main()
