"""Issue 35's goal on a corpus with known faults: what the default quality rules keep out, and what they
cost a clean clip.

`build_fault_corpus` writes a manifest (`manifest.jsonl`, with `asr_text`) and its WAVs: four speakers
whose clips are two of the demo corpus's good clips (benchmarks/make_big_corpus.good_clips) joined, with
a gap of random length in the middle (so no two clips share audio by chance), sped up or slowed down by 0.75, 0.9, 1.15 and 1.35 (clearly different speaking rates), each with `--clean` clean clips
and `--per-fault` clips of every fault kind:

- `transcript`: the text of two other clips (its `asr_text` is what it says);
- `clipped`: the audio x8, hard-clipped at full scale;
- `narrowband`: the audio through 8 kHz (resampled down and back up);
- `noisy`: white noise at 0 dB SNR;
- `pause`: 2.5 s of silence inserted in the middle of the speech;
- `rate`: the audio played three times as fast (its speaker's rate tripled: a speaking-rate outlier);
- `duplicate`: a clean clip's audio again under another id (the pair: exactly one must remain).

The corpus is preprocessed with the default config (`python -m melshards preprocess`) and scored from
rejected.jsonl: per fault kind the share kept out and the reasons; duplicates left of each pair; the
share of clean clips rejected for a quality reason. Goal: >= 90% of each fault kept out, exactly one
of each duplicate pair left, <= 3% of clean clips lost.

Run: python -m benchmarks.quality.faults [--clean 25] [--per-fault 3] [--workers 2] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import soundfile

from benchmarks.common import emit, preprocess_command, preprocess_rejected
from benchmarks.preprocess.scale import WORK, beam_flags
from melshards.shards_schema.stats import QUALITY_REASONS

SR = 22050
SPEEDS = {"slow": 0.75, "calm": 0.9, "brisk": 1.15, "fast": 1.35}
FAULTS = ("transcript", "clipped", "narrowband", "noisy", "pause", "rate", "duplicate")


def resample(y: np.ndarray, factor: float) -> np.ndarray:
    """`y` played `factor` times faster (linear interpolation): shorter by 1/factor."""
    n = max(1, int(round(len(y) / factor)))
    return np.interp(np.arange(n) * factor, np.arange(len(y)), y).astype(np.float32)


def through_8k(y: np.ndarray) -> np.ndarray:
    """`y` resampled to 8 kHz and back (nothing above 4 kHz survives)."""
    import soxr

    return soxr.resample(soxr.resample(y, SR, 8000), 8000, SR).astype(np.float32)


def with_fault(kind: str, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if kind == "clipped":
        return np.clip(y * 8.0, -1.0, 1.0)
    if kind == "narrowband":
        return through_8k(y)
    if kind == "noisy":
        noise = rng.standard_normal(len(y)).astype(np.float32)
        return y + noise * float(np.sqrt(np.mean(y**2) / np.mean(noise**2)))
    if kind == "rate":
        return resample(y, 3.0)
    if kind == "pause":
        mid = len(y) // 2
        return np.concatenate([y[:mid], np.zeros(int(2.5 * SR), np.float32), y[mid:]])
    return y


def build_fault_corpus(
    out: str | Path,
    clean: int,
    per_fault: int,
    seed: int = 1,
    speakers: tuple[str, ...] = tuple(SPEEDS),
    parts: int = 2,
) -> list[dict]:
    """Write the manifest and WAVs under `out`; returns its rows, each with "fault" (None for a clean
    clip; "duplicate" for the second of a pair, whose first is its "pair"). `speakers`: which of
    `SPEEDS`; `parts`: demo clips per clip."""
    from benchmarks.make_big_corpus import good_clips

    out = Path(out)
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    sources = good_clips()
    rng, pick = np.random.default_rng(seed), random.Random(seed)
    rows: list[dict] = []

    def write(cid: str, y: np.ndarray, **row) -> dict:
        peak = float(np.max(np.abs(y))) or 1.0
        scaled = y if row.get("fault") == "clipped" else y * (0.5 / peak)
        soundfile.write(out / "wavs" / f"{cid}.wav", scaled, SR, subtype="PCM_16")
        r = {"id": cid, "audio": f"wavs/{cid}.wav", "language": "en", **row}
        rows.append(r)
        return r

    for speaker in speakers:
        speed = SPEEDS[speaker]
        for i in range(clean + per_fault * len(FAULTS)):
            chosen = pick.sample(sources, parts)  # joined, a gap of its own in the middle: unique audio
            text, y = " ".join(t for _, t, _ in chosen), np.concatenate([a for _, _, a in chosen])
            gap = np.zeros(pick.randrange(int(0.15 * SR), int(0.4 * SR)), np.float32)
            y = resample(np.concatenate([y[: len(y) // 2], gap, y[len(y) // 2 :]]), speed)
            cid = f"{speaker}_{i:03d}"
            k = i - clean
            fault = None if k < 0 else FAULTS[k // per_fault]
            if fault == "transcript":
                others = [src for src in sources if src[1] not in text]  # none of the clip's own sentences
                other = " ".join(t for _, t, _ in pick.sample(others, parts))
                write(cid, y, text=other, asr_text=text, speaker=speaker, fault=fault)
            elif fault == "duplicate":
                first = write(cid + "a", y, text=text, asr_text=text, speaker=speaker, fault=None)
                write(cid + "b", y, text=text, asr_text=text, speaker=speaker, fault=fault, pair=first["id"])
            else:
                write(cid, with_fault(fault or "", y, rng), text=text, asr_text=text, speaker=speaker, fault=fault)
    manifest = out / "manifest.jsonl"
    keep = ("id", "audio", "text", "asr_text", "speaker", "language")
    manifest.write_text("".join(json.dumps({k: r[k] for k in keep}) + "\n" for r in rows), encoding="utf-8")
    (out / "faults.json").write_text(json.dumps(rows))
    return rows


def score(rows: list[dict], rejected: list[dict]) -> dict:
    """Per fault kind the share kept out and its reasons; duplicate pairs with exactly one clip left;
    clean clips rejected for a quality reason."""
    why = {r["id"]: r["reason"] for r in rejected}
    out: dict = {"faults": {}}
    for kind in FAULTS:
        if kind == "duplicate":
            continue
        ids = [r["id"] for r in rows if r.get("fault") == kind]
        reasons = Counter(why.get(i, "kept") for i in ids)
        out["faults"][kind] = {"clips": len(ids), "kept_out": len(ids) - reasons["kept"], "reasons": dict(reasons)}
    pairs = [(r["pair"], r["id"]) for r in rows if r.get("fault") == "duplicate"]
    out["duplicate_pairs"] = len(pairs)
    out["duplicate_pairs_one_left"] = sum((a not in why) + (b not in why) == 1 for a, b in pairs)
    out["duplicate_reasons"] = dict(Counter(why.get(b, "kept") for _, b in pairs))
    clean = [r for r in rows if r.get("fault") is None]
    lost = Counter(why[r["id"]] for r in clean if why.get(r["id"]) in QUALITY_REASONS)
    out["clean_clips"] = len(clean)
    out["clean_rejected_quality"] = sum(lost.values())
    out["clean_reasons"] = dict(lost)
    return out


def add_fault_args(ap: argparse.ArgumentParser) -> None:
    """The arguments of a benchmark over the fault corpus: --clean, --per-fault, --workers, --work-dir."""
    ap.add_argument("--clean", type=int, default=25)
    ap.add_argument("--per-fault", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-dir", default=WORK)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_fault_args(ap)
    args = ap.parse_args(argv)
    work = Path(args.work_dir) / f"faults-{args.clean}-{args.per_fault}"
    rows = build_fault_corpus(work / "corpus", args.clean, args.per_fault)
    out = work / "out"
    rejected = preprocess_rejected(
        preprocess_command(work / "corpus" / "manifest.jsonl", out, *beam_flags(args.workers)), out
    )
    result = {"benchmark": "quality_faults", "clips": len(rows), **score(rows, rejected)}
    for kind, f in result["faults"].items():
        print(f"{kind:<11} kept out {f['kept_out']}/{f['clips']} {f['reasons']}")
    print(f"duplicate pairs with exactly one left: {result['duplicate_pairs_one_left']}/{result['duplicate_pairs']}")
    print(f"clean clips rejected for quality: {result['clean_rejected_quality']}/{result['clean_clips']}")
    emit(result)
    return result


if __name__ == "__main__":
    main()
