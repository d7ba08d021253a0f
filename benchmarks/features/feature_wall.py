"""What pitch, energy and audio cost: preprocess wall, bytes per record and shard size per hour of audio.

The same corpus (benchmarks/make_big_corpus.py, 1,000 clips by default) is preprocessed three ways,
each a separate `python -m melshards preprocess` process timed from start to exit, interleaved in
every round (the machine is shared: compare same-round ratios):

- `mel`: the default config (text and log-mel);
- `pitch_energy`: + `features: {pitch: true, energy: true}` (the default tracker, `pitch.tracker`);
- `all`: + `audio: true` as well.

Reported: wall per variant (median over rounds), the per-round ratios to `mel` and their median
(goal, issue 21: pitch + energy <= 1.5x mel only), bytes per record and MB of shards per hour of
audio of each variant (from the shards written), and the share of the per-clip work each part
takes: decode + resample + trim, the STFT + mel, energy, the pitch tracker and the int16 audio, timed
in this process on `--profile-clips` clips of the same corpus (one core).

Run: python -m benchmarks.features.feature_wall [--clips 1000] [--rounds 3] [--workers 2] [--tracker dio]
         [--profile-clips 100] [--work-dir /tmp/melshards-bench]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks import common

VARIANTS = {
    "mel": {},
    "pitch_energy": {"pitch": True, "energy": True},
    "all": {"pitch": True, "energy": True, "audio": True},
}


def shard_sizes(out: Path) -> dict:
    """Bytes per record and MB of shards per hour of audio in the shards of a finished run."""
    stats = json.loads((out / "stats.json").read_text())
    records = stats["counts"]["in_shards"]
    total = sum(f.stat().st_size for f in out.glob("*.tfrecord"))
    hours = sum(s["hours"] for s in stats["speakers"])
    return {
        "bytes_per_record": round(total / records),
        "mb_per_audio_hour": round(total / 1e6 / hours, 1),
        "records": records,
        "audio_hours": round(hours, 3),
    }


def profile(corpus: str, clips: int, tracker: str) -> dict:
    """Seconds per clip of each part of `clips.featurize` with every feature on, in this process."""
    from melshards.preprocess.clip import audio, features
    from melshards.preprocess.clip.clips import featurize, load_trimmed
    from melshards.preprocess.config import FeaturesConfig, PitchConfig, PreprocessConfig

    cfg = PreprocessConfig(features=FeaturesConfig(True, True, True), pitch=PitchConfig(tracker=tracker))
    rows = []
    for line in (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines()[:clips]:
        clip_id = line.split("|")[0]
        rows.append(str(Path(corpus) / "wavs" / f"{clip_id}.wav"))
    parts = {"decode_trim": 0.0, "stft_mel": 0.0, "energy": 0.0, "pitch": 0.0, "audio_int16": 0.0}
    seconds = 0.0
    sr, hop = cfg.audio.sample_rate, cfg.mel.hop_length
    featurize({"id": "warm-up", "audio": rows[0], "text": "a", "language": "en", "speaker": "s"}, cfg)  # imports
    for path in rows:
        t0 = time.perf_counter()
        y = load_trimmed(path, cfg)
        t1 = time.perf_counter()
        mag = audio.magnitude(y, cfg.mel)
        audio.log_mel_of(mag, sr, cfg.mel)
        t2 = time.perf_counter()
        audio.energy_of(mag)
        t3 = time.perf_counter()
        frames = audio.num_frames(y.size, hop)
        features.pitch(y, sr, hop, frames, cfg.pitch)
        t4 = time.perf_counter()
        features.audio_int16(y, frames, hop)
        t5 = time.perf_counter()
        for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            parts[key] += dt
        seconds += y.size / sr
    total = sum(parts.values())
    return {
        "clips": len(rows),
        "audio_s": round(seconds, 1),
        "cpu_s_per_audio_hour": {k: round(v / seconds * 3600, 1) for k, v in parts.items()},
        "share": {k: round(v / total, 3) for k, v in parts.items()},
        "pitch_over_stft_mel": round(parts["pitch"] / parts["stft_mel"], 2) if parts["stft_mel"] else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_corpus_args(ap, rounds=3)
    ap.add_argument("--tracker", default="dio")
    ap.add_argument("--profile-clips", type=int, default=100)
    args = ap.parse_args(argv)
    work, corpus = common.work_and_corpus(args)
    configs = {v: {"features": f, "pitch": {"tracker": args.tracker}} for v, f in VARIANTS.items()}
    runs = common.preprocess_rounds(
        corpus, common.write_configs(work, "features", configs), args.workers, args.rounds, work, "features"
    )
    walls, cpus = common.figures(runs, "wall_s"), common.figures(runs, "cpu_s")
    sizes = {v: shard_sizes(work / f"features-out-{v}") for v in VARIANTS}
    ratios = {v: common.round_ratios(walls, v, "mel") for v in VARIANTS if v != "mel"}
    cpu_ratios = {v: common.round_ratios(cpus, v, "mel") for v in VARIANTS if v != "mel"}
    parts = profile(corpus, args.profile_clips, args.tracker)
    result = {
        **common.round_medians("feature_wall", args, runs),
        "tracker": args.tracker,
        **{f"{v}_over_mel": round(statistics.median(x), 3) for v, x in ratios.items()},
        **{f"{v}_over_mel_cpu": round(statistics.median(x), 3) for v, x in cpu_ratios.items() if x},
        "per_round_ratios": {v: [round(x, 3) for x in xs] for v, xs in ratios.items()},
        "sizes": sizes,
        "per_clip_parts": parts,
    }
    print(
        "\n| variant | wall s (median) | / mel (median of rounds) | CPU s (median) | / mel | bytes/record | "
        "MB of shards per audio hour |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        ratio = "1" if v == "mel" else f"{result[f'{v}_over_mel']:.3f} ({', '.join(f'{x:.3f}' for x in ratios[v])})"
        cpu = "1" if v == "mel" else f"{result.get(f'{v}_over_mel_cpu', 0):.3f}"
        print(
            f"| {v} | {result[f'wall_s_{v}']:.1f} | {ratio} | {result[f'cpu_s_{v}']:.1f} | {cpu} | "
            f"{sizes[v]['bytes_per_record']:,} | {sizes[v]['mb_per_audio_hour']:,} |"
        )
    print(f"\nper-clip work, {parts['clips']} clips ({parts['audio_s']} s of audio), one core, CPU s per audio hour:")
    for k, v in parts["cpu_s_per_audio_hour"].items():
        print(f"  {k:<12}{v:>8.1f}  ({100 * parts['share'][k]:.1f}%)")
    print(f"goal: pitch_energy / mel <= 1.5; measured {result['pitch_energy_over_mel']:.3f}")
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
