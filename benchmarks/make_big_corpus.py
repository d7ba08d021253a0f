"""Generate an LJSpeech-sized benchmark corpus from the shipped demo corpus (never committed).

Every clip is 1-4 good clips of data/ljspeech_tiny (decoded and resampled to 22050 Hz by the
project's own `melshards.preprocess.clip.audio.decode_audio`) joined by short silent gaps, with their normalised
texts joined by spaces. Clip lengths follow an LJSpeech-like distribution: 1-10 s, mean ~6.6 s.
Output is LJSpeech layout: <out>/metadata.csv (`id|text|normalized_text`) + <out>/wavs/<id>.wav,
22050 Hz mono 16-bit PCM.

Deterministic: clip i depends only on (--seed, i), so the first N clips of a 13,100-clip corpus
are exactly the clips of an N-clip corpus (the small throughput corpus is a prefix of the big one).

`--max-s 15 --sd-s 3.5` makes the broader 1-15 s spread the length-bucket benchmark trains on
(benchmarks/buckets/training.py).

`--links-of DIR --times N` builds a corpus N times the size of the corpus in DIR without writing
audio: each wav of DIR gets N new names (hard links, `<id>x<k>.wav`, k = 0..N-1), and each metadata
row is repeated with those ids and the same texts. 131,000 distinct WAVs would be ~36 GiB; the links
hold the 3.6 GiB of the 13,100-clip corpus, so the page cache holds all of the audio (the 10x runs
read from memory, as the 13,100-clip runs do).

Run: python -m benchmarks.make_big_corpus --out /tmp/melshards-bench/ljbig [--clips 13100] [--seed 1]
     [--max-s 10] [--sd-s 2.1]
     python -m benchmarks.make_big_corpus --out /tmp/melshards-bench/ljbig-x10 --links-of /tmp/melshards-bench/ljbig --times 10
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

TINY = Path(__file__).resolve().parents[1] / "data" / "ljspeech_tiny"
SR = 22050
MAX_S, MIN_S = 10.0, 1.0
TARGET_MEAN_S, TARGET_SD_S = 7.3, 2.1  # of the target length; clips undershoot it to a mean of ~6.6 s
LJSPEECH_CLIPS = 13100
LINKED_MARK = ".melshards-linked-corpus"  # in a corpus link_corpus made: it may replace it


def good_clips(max_s: float = MAX_S) -> list[tuple[str, str, np.ndarray]]:
    """(id, normalized text, mono float32 @ 22050 Hz) of the demo corpus's good clips <= 10 s."""
    from melshards.preprocess.clip import audio

    seen, out = set(), []
    for line in (TINY / "metadata.csv").read_text(encoding="utf-8").splitlines():
        f = line.split("|")
        if len(f) < 3 or not f[0].startswith(("LJT001", "LJT002", "LJT003")) or f[0] in seen:
            continue
        seen.add(f[0])
        path = next(p for p in (TINY / "wavs").glob(f[0] + ".*"))
        y, _ = audio.decode_audio(path.read_bytes(), SR)
        if len(y) / SR <= max_s:
            out.append((f[0], f[2] or f[1], y))
    return out


def plan_clip(
    i: int, seed: int, durs: list[float], max_s: float = MAX_S, sd_s: float = TARGET_SD_S
) -> list[tuple[int, float]]:
    """[(source index, gap before it in seconds)] for clip i: greedy fill up to a drawn target length."""
    rng = random.Random(f"{seed}:{i}")
    target = min(max_s, max(MIN_S, rng.gauss(TARGET_MEAN_S, sd_s)))
    parts, total = [], 0.0
    while len(parts) < 4:
        gap = rng.uniform(0.15, 0.4) if parts else 0.0
        fits = [k for k, d in enumerate(durs) if total + gap + d <= target]
        if not fits:
            if not parts:  # nothing fits the target: take the shortest clip
                fits = [min(range(len(durs)), key=durs.__getitem__)]
            else:
                break
        k = rng.choice(fits)
        parts.append((k, gap))
        total += gap + durs[k]
    return parts


def joined_clip(plan: list[tuple[int, float]], src: list[tuple[str, str, np.ndarray]]) -> tuple[str, np.ndarray]:
    """The clip of `plan` (`plan_clip`) from `src` (`good_clips`): its text (the parts' texts joined by
    spaces) and its samples (the parts with their gaps of silence before them, clipped to full scale)."""
    pieces, texts = [], []
    for k, gap in plan:
        if gap:
            pieces.append(np.zeros(int(round(gap * SR)), np.float32))
        pieces.append(src[k][2])
        texts.append(src[k][1])
    return " ".join(texts), np.clip(np.concatenate(pieces), -1.0, 1.0)


def link_corpus(src: str | Path, out: str | Path, times: int) -> dict:
    """`out`: the LJSpeech-layout corpus in `src` `times` times over, each wav hard-linked under `times`
    new ids (`<id>x<k>`) and each metadata row repeated with them. An `out` this function made before
    with the same rows is kept as it is; one it did not make is refused, never replaced."""
    src, out = Path(src), Path(out)
    rows = [line for line in (src / "metadata.csv").read_text(encoding="utf-8").splitlines() if line.strip()]
    meta = out / "metadata.csv"
    if out.exists():
        if (
            (out / LINKED_MARK).exists()
            and meta.exists()
            and sum(1 for _ in meta.open(encoding="utf-8")) == len(rows) * times
        ):
            print(f"{out}: {len(rows) * times} rows linked from {src} before, kept")
            return {"out": str(out), "clips": len(rows) * times, "reused": True}
        if not (out / LINKED_MARK).exists():
            raise SystemExit(f"{out} exists and was not made by --links-of; remove it or pick another --out")
        shutil.rmtree(out)
    t0 = time.perf_counter()
    (out / "wavs").mkdir(parents=True)
    (out / LINKED_MARK).write_text(f"{src} x{times}\n")
    lines = []
    for k in range(times):
        for line in rows:
            cid, rest = line.split("|", 1)
            os.link(src / "wavs" / f"{cid}.wav", out / "wavs" / f"{cid}x{k}.wav")
            lines.append(f"{cid}x{k}|{rest}")
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = {
        "out": str(out),
        "clips": len(lines),
        "links_of": str(src),
        "times": times,
        "reused": False,
        "seconds_to_link": round(time.perf_counter() - t0, 1),
    }
    print(
        f"wrote {out}: {len(lines)} rows, hard links to the {len(rows)} wavs of {src} in {summary['seconds_to_link']} s"
    )
    return summary


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (LJSpeech layout); replaced if it exists")
    ap.add_argument("--clips", type=int, default=LJSPEECH_CLIPS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-s", type=float, default=MAX_S, help="longest clip in seconds")
    ap.add_argument("--sd-s", type=float, default=TARGET_SD_S, help="spread of the drawn clip lengths (s)")
    ap.add_argument("--plan-only", action="store_true", help="print the duration summary, write nothing")
    ap.add_argument("--links-of", help="an LJSpeech-layout corpus to repeat --times times by hard links")
    ap.add_argument("--times", type=int, default=10, help="with --links-of: how many names each wav gets")
    args = ap.parse_args(argv)
    if args.links_of:
        return link_corpus(args.links_of, args.out, args.times)

    t0 = time.perf_counter()
    src = good_clips(args.max_s)
    durs = [len(y) / SR for _, _, y in src]
    plans = [plan_clip(i, args.seed, durs, args.max_s, args.sd_s) for i in range(args.clips)]
    seconds = np.array([sum(g + durs[k] for k, g in p) for p in plans])
    summary = {
        "clips": args.clips,
        "sources": len(src),
        "hours": round(float(seconds.sum()) / 3600, 2),
        "mean_s": round(float(seconds.mean()), 3),
        "min_s": round(float(seconds.min()), 2),
        "max_s": round(float(seconds.max()), 2),
        "parts_mean": round(float(np.mean([len(p) for p in plans])), 2),
    }
    print(
        f"{args.clips} clips from {len(src)} sources: {summary['hours']} h, mean {summary['mean_s']} s "
        f"(min {summary['min_s']}, max {summary['max_s']}), {summary['parts_mean']} parts/clip",
        flush=True,
    )
    if args.plan_only:
        return summary

    import soundfile as sf

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "wavs").mkdir(parents=True)
    lines = []
    for i, plan in enumerate(plans):
        cid = f"LJB{i // 1000:03d}-{i % 1000:04d}"
        text, y = joined_clip(plan, src)
        sf.write(out / "wavs" / f"{cid}.wav", y, SR, subtype="PCM_16")
        lines.append(f"{cid}|{text}|{text}")
        if (i + 1) % 2000 == 0:
            print(f"  {i + 1} clips written", flush=True)
    (out / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    size = sum(p.stat().st_size for p in (out / "wavs").iterdir())
    summary.update(out=str(out), bytes=size, seconds_to_generate=round(time.perf_counter() - t0, 1))
    print(f"wrote {out}: {args.clips} wavs, {size / 2**30:.2f} GiB in {summary['seconds_to_generate']} s")
    return summary


if __name__ == "__main__":
    sys.path.insert(0, os.fspath(Path(__file__).resolve().parents[1]))
    main()
