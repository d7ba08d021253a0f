"""What a per-clip extractor adds to preprocess: wall and CPU of the same corpus with and without a tiny
ONNX speaker-embedding extractor (examples/extractors.py, through `melshards.extractors:onnx_model`).

The corpus (benchmarks/make_big_corpus.py) is preprocessed two ways, each a separate `python -m
melshards preprocess` process timed from start to exit, interleaved in every round (the machine is
shared: compare same-round ratios):

- `mel`: the default config;
- `onnx_embedding`: + `extractors:` one ONNX model (4 statistics x a 4x4 projection) at 16 kHz.

The model's own arithmetic is negligible, so the difference is the extractor machinery: loading
onnxruntime and the model once per worker, resampling each clip to 16 kHz, one session call per clip,
the outputs' check, arrays written to temp files without a cache, the 16 bytes per record, and the centroids.

Then, in this process on `--profile-clips` clips (one core): CPU seconds per audio hour of measuring a
clip (decode, trim, STFT, mel) and of the extractor's part (resampling to 16 kHz, the model call, the
check), the per-clip share that survives the machine's noise (walls on a shared machine do not).

Run: python -m benchmarks.features.extractor_cost [--clips 1000] [--rounds 3] [--workers 2] [--profile-clips 100]
         [--work-dir /tmp/melshards-bench]   (--rounds 0: the profile alone)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from benchmarks import common
from benchmarks.features.feature_wall import shard_sizes


def configs(work: Path) -> dict[str, str]:
    from examples.extractors import build_onnx_embedding

    model = build_onnx_embedding(work / "bench-embedding.onnx")
    extractor = {
        "factory": "melshards.extractors:onnx_model",
        "options": {
            "path": str(model),
            "name": "tiny_embedding",
            "sample_rate": 16000,
            "outputs": [{"name": "speaker_embedding", "kind": "vector", "dim": 4}],
        },
    }
    return common.write_configs(work, "extractor", {"mel": {}, "onnx_embedding": {"extractors": [extractor]}})


def profile(corpus: str, clips: int, model: str) -> dict:
    """CPU seconds per audio hour of `clips.featurize` (mel only) and of the extractor on the same clips."""
    import time

    from melshards.preprocess.clip import extractor_plugins
    from melshards.preprocess.clip.clips import SAMPLES, featurize
    from melshards.preprocess.config import ExtractorConfig, PreprocessConfig

    entry = yaml.safe_load(Path(model).read_text())["extractors"][0]
    cfg = PreprocessConfig(extractors=(ExtractorConfig(**entry),))
    runner = extractor_plugins.for_run(cfg)
    runner.loaded  # noqa: B018 (build it outside the timing)
    lines = (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines()[:clips]
    rows = [
        {"id": x.split("|")[0], "audio": str(Path(corpus) / "wavs" / f"{x.split('|')[0]}.wav"), "text": "a"}
        for x in lines
    ]
    first, arrays = featurize(dict(rows[0], language="en", speaker="s"), cfg)  # imports, first-call set-up
    runner.apply([arrays.pop(SAMPLES)], [first["mel_frames"]], cfg.audio.sample_rate, cfg.mel.hop_length)
    measure = extract = seconds = 0.0
    for row in rows:
        t0 = time.process_time()
        clip, out = featurize(dict(row, language="en", speaker="s"), cfg)
        t1 = time.process_time()
        samples = out.pop(SAMPLES)
        runner.apply([samples], [clip["mel_frames"]], cfg.audio.sample_rate, cfg.mel.hop_length)
        t2 = time.process_time()
        measure, extract, seconds = measure + t1 - t0, extract + t2 - t1, seconds + samples.size / cfg.audio.sample_rate
    return {
        "clips": len(rows),
        "audio_s": round(seconds, 1),
        "measure_cpu_s_per_audio_hour": round(measure / seconds * 3600, 2),
        "extractor_cpu_s_per_audio_hour": round(extract / seconds * 3600, 2),
        "extractor_over_measure": round(extract / measure, 3),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_corpus_args(ap, rounds=3)
    ap.add_argument("--profile-clips", type=int, default=100)
    args = ap.parse_args(argv)
    work, corpus = common.work_and_corpus(args)
    variants = configs(work)
    parts = profile(corpus, args.profile_clips, variants["onnx_embedding"])
    print(
        f"per clip, one core, {parts['clips']} clips ({parts['audio_s']} s of audio): measure "
        f"{parts['measure_cpu_s_per_audio_hour']} CPU s per audio hour, extractor {parts['extractor_cpu_s_per_audio_hour']} "
        f"({parts['extractor_over_measure']:.3f} of measure)",
        flush=True,
    )
    if not args.rounds:
        common.emit({"benchmark": "extractor_cost", "per_clip": parts})
        return {"per_clip": parts}
    runs = common.preprocess_rounds(corpus, variants, args.workers, args.rounds, work, "extractor")
    walls, cpus = common.figures(runs, "wall_s"), common.figures(runs, "cpu_s")
    sizes = {v: shard_sizes(work / f"extractor-out-{v}") for v in variants}
    ratios = common.round_ratios(walls, "onnx_embedding", "mel")
    cpu_ratios = common.round_ratios(cpus, "onnx_embedding", "mel")
    result = {
        **common.round_medians("extractor_cost", args, runs),
        "onnx_over_mel": round(statistics.median(ratios), 3),
        "onnx_over_mel_cpu": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        "per_round_ratios": [round(x, 3) for x in ratios],
        "sizes": sizes,
        "per_clip": parts,
    }
    print("\n| variant | wall s (median) | / mel (rounds) | CPU s (median) | / mel | bytes/record |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        ratio = "1" if v == "mel" else f"{result['onnx_over_mel']:.3f} ({', '.join(f'{x:.3f}' for x in ratios)})"
        cpu = "1" if v == "mel" else f"{result['onnx_over_mel_cpu']}"
        print(
            f"| {v} | {result[f'wall_s_{v}']:.1f} | {ratio} | {result[f'cpu_s_{v}']:.1f} | {cpu} | "
            f"{sizes[v]['bytes_per_record']:,} |"
        )
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
