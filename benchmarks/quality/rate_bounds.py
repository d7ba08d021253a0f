"""The speaking-rate rule's two settings and its bounds for a small speaker side by side (issue 46's goal: no clean speaker loses more than 5%
of its clips to the quality rules, >= 90% of the planted faults kept out): for `rate_iqr_k` 2, 2.5 and 3
and `rate_min_clips` 10, 20 and 30, the share of clean speakers of 5 to 400 clips that lose more than 5% of
their clips to the rule, and the share of clips read three times as fast that it keeps out; and for a
speaker of fewer than `rate_min_clips` clips, its language's bounds (`language`, the rule before) against
its own median times its language's within-speaker spread (from `quality_rules.PACE_MIN_CLIPS` clips) at
k (`pace 1k`) and at `quality_rules.PACE_K_FACTOR` (2) times k (`pace 2k`, the rule now).

Clean per-clip rates (symbols per second of trimmed speech, measured as the job measures them: the
symbols `clips.prepare_texts` gives over the samples `clips.trim_span` keeps) come from four sources:

- `tiny` (data): the good clips of data/ljspeech_tiny but LJT003-0002 (read at 380 words a minute on
  purpose, 2.2 times the median), real texts read by twelve espeak-ng voices at 140-190 words a minute:
  a spread wider than one speaker's, and no tail;
- `joined` (data): the first 1,000 clips of benchmarks/make_big_corpus.py (1-4 of those clips joined by
  gaps: the throughput corpus, the 1,000-clip run of docs/performance.md), built in memory;
- `normal` and `t3` (a model, not data): log rate normal (sd 0.10), or Student's t with 3 degrees of
  freedom (scale 0.065, the same IQR within 1%), whose heavy tails stand for what synthetic speech lacks:
  the short clips, hesitations and odd trims of real recordings.

A speaker's clips are a draw from a source (with replacement) times the speaker's pace, exp(N(0, sd))
with sd `--pace-sd` (a model of how the speakers of one language differ; the fault corpus's 0.75x-1.35x
speakers are about 0.23). A trial is one language of 40 such speakers of n clips each. Every speaker is
judged by its own bounds (from its n clips), by its language's (from the 40 n clips): Q1 - k*IQR .. Q3 +
k*IQR with the rule's quartiles (`quality_rules.iqr_bounds` of the `rate_key` histograms), and at its pace
(its median times q1 - f*k*(q3 - q1) .. q3 + f*k*(q3 - q1) of the 40 n rates each over its speaker's
median, `quality_rules.pace_bounds`, f 1 or 2), each with the ceiling (`quality_rules.RATE_CEILINGS`). A setting judges a
speaker with at least `rate_min_clips` clips by its own bounds, else (from `PACE_MIN_CLIPS` clips) by its
language's or at its pace; a language with fewer is not judged (it loses nothing, and a
fault in it is kept out only by the ceiling). In the fault trials 5% of the language's clips, one of a
speaker at most, are read three times as fast (the rate x3, as benchmarks/quality/faults.py plants them)
and are in the groups when their bounds are made, as in a run. One trial per source and size is judged
again by the job's own code (`rate_histograms`, `rate_bounds`, `rate_rejection`; `language` with its
`PACE` bounds left out, `pace 1k` with those of k/2) at every setting and must drop exactly the same clips.

Last, the fault corpora of benchmarks/quality/faults.py (four speakers at 0.75x-1.35x, one language; 14
to 49 clips a speaker) are built, every clip's rate measured, and the rate rule alone applied to them at
every setting and both bounds of a small speaker by the job's code: the 3x faults kept out, the clean
clips lost.

Run: python -m benchmarks.quality.rate_bounds [--trials 25] [--pace-sd 0.1] [--seed 1] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK
from melshards.preprocess.clip import clips, quality
from melshards.preprocess.config import PreprocessConfig, QualityRulesConfig
from melshards.preprocess.stats import quality_rules
from melshards.shards_schema.vocab import tokens

SIZES = (5, 10, 15, 20, 30, 50, 100, 400)  # clips of a speaker
KS = (2.0, 2.5, 3.0)  # rate_iqr_k
MIN_CLIPS = (10, 20, 30)  # rate_min_clips
# the bounds of a speaker of fewer than rate_min_clips clips: before; at its pace at k and at 2 k (now)
PACE_FACTORS = {"pace 1k": 1, "pace 2k": 2}
SMALL = ("language", *PACE_FACTORS)
SPEAKERS = 40  # of the language of a trial
PACE_SD = 0.10  # of log rate between the speakers of a language (a model; --pace-sd)
MODEL_MEDIAN = 15.0  # letters per second, for the models
LOST_SHARE = 0.05  # a speaker losing more than this share of its clips breaks the goal
FAULT_SPEED = 3.0  # the planted rate fault: the clip read three times as fast
FAULT_SHARE = 0.05  # of a language's clips in a fault trial (benchmarks/quality/faults.py: 3 of 49 a speaker)
FAULT_CORPORA = ((6, 1), (12, 1), (25, 1), (25, 3))  # (clean clips, clips of each fault kind) of a speaker
FAST_ON_PURPOSE = "LJT003-0002"  # the demo corpus's clip read at 380 words a minute (its README)
CEILING = quality_rules.RATE_CEILINGS["alphabetic"]  # every source is English letters


def measured_rate(text: str, y: np.ndarray, cfg: PreprocessConfig) -> float:
    """A clip's speaking rate as the job measures it: its text's symbols in the English front end over
    the seconds the trim keeps."""
    symbols = clips.prepare_texts([{"text": text, "language": "en"}], cfg)[0]
    if not isinstance(symbols, str):
        raise SystemExit(f"{text!r}: the front end gives no symbols ({symbols})")
    start, end = clips.trim_span(y, cfg)
    return quality.speaking_rate(len(tokens(symbols, cfg.text_unit)), (end - start) / cfg.audio.sample_rate)


def data_sources(cfg: PreprocessConfig, joined: int = 1000) -> dict[str, np.ndarray]:
    """The measured rates of the demo corpus's good clips (`tiny`) and of the first `joined` clips of
    benchmarks/make_big_corpus.py (`joined`)."""
    from benchmarks.make_big_corpus import MAX_S, SR, good_clips, joined_clip, plan_clip

    every = good_clips(max_s=float("inf"))
    tiny = [measured_rate(text, y, cfg) for cid, text, y in every if cid != FAST_ON_PURPOSE]
    src = [c for c in every if len(c[2]) / SR <= MAX_S]  # good_clips() as make_big_corpus takes them
    durs = [len(y) / SR for _, _, y in src]
    rates = [measured_rate(*joined_clip(plan_clip(i, 1, durs), src), cfg) for i in range(joined)]
    return {"tiny": np.array(tiny), "joined": np.array(rates)}


def drawer(source: str, data: dict[str, np.ndarray]) -> Callable[[np.random.Generator, tuple], np.ndarray]:
    """Draws of clean rates of one source, in an array of the shape asked."""
    if source == "normal":
        return lambda rng, shape: MODEL_MEDIAN * np.exp(0.10 * rng.standard_normal(shape))
    if source == "t3":
        return lambda rng, shape: MODEL_MEDIAN * np.exp(0.065 * rng.standard_t(3, shape))
    values = data[source]
    return lambda rng, shape: rng.choice(values, size=shape)


def quartiles(rates: np.ndarray) -> tuple[float, float]:
    """Q1 and Q3 of a group's rates as the rule reads them: `iqr_bounds` at k=0 of the `rate_key`
    histogram (np.rint rounds half to even, as `round` does)."""
    keys, counts = np.unique(np.rint(rates * quality_rules.RATE_SCALE).astype(np.int64), return_counts=True)
    return quality_rules.iqr_bounds(dict(zip(keys.tolist(), counts.tolist())), 0.0)


def outside(rates: np.ndarray, q: tuple[float, float], k: float) -> np.ndarray:
    """Which rates the rule drops against quartiles `q` at `k` (`iqr_bounds`' arithmetic), or for the
    ceiling."""
    q1, q3 = q
    low, high = q1 - k * (q3 - q1), q3 + k * (q3 - q1)
    return ~((low <= rates) & (rates <= high)) | (rates > CEILING)


def faulty_speakers(n: int) -> int:
    """How many speakers of n clips have a fault in a fault trial: one clip each, `FAULT_SHARE` of the
    language's clips (at least one speaker, at most all)."""
    return min(SPEAKERS, max(1, round(FAULT_SHARE * SPEAKERS * n)))


def trial(draw: Callable, rng: np.random.Generator, n: int, pace_sd: float, faults: int = 0) -> np.ndarray:
    """The rates [SPEAKERS, n] of one language; the first clip of the first `faults` speakers read
    `FAULT_SPEED` times as fast."""
    pace = np.exp(pace_sd * rng.standard_normal((SPEAKERS, 1)))
    rates = draw(rng, (SPEAKERS, n)) * pace
    rates[:faults, 0] *= FAULT_SPEED
    return rates


def key_hist(rates: np.ndarray) -> dict[int, int]:
    keys, counts = np.unique(np.rint(rates * quality_rules.RATE_SCALE).astype(np.int64), return_counts=True)
    return dict(zip(keys.tolist(), counts.tolist()))


def pace_ratio_hist(hists: list[dict[int, int]]) -> dict[int, int]:
    """The speakers' rate keys each over its speaker's inverted-CDF median key, in thousandths rounded
    half up, summed: the language's within-speaker spread as `quality_rules.pace_ratios` makes it."""
    out: dict[int, int] = {}
    for h in hists:
        keys = sorted(h)
        cumulative = np.cumsum([h[v] for v in keys])
        median = keys[int(np.searchsorted(cumulative, cumulative[-1] / 2))]
        for key, c in h.items():
            ratio = (2 * key * quality_rules.RATIO_SCALE + median) // (2 * median)
            out[ratio] = out.get(ratio, 0) + c
    return out


def judged(rates: np.ndarray) -> dict[tuple[str, float], np.ndarray]:
    """{(own | language | pace 1k | pace 2k, k): which clips [SPEAKERS, n] the rule drops} for every k
    of `KS`."""
    language = quartiles(rates.ravel())
    own = [quartiles(r) for r in rates]
    hists = [key_hist(r) for r in rates]
    ratios = pace_ratio_hist(hists)
    out = {}
    for k in KS:
        out["own", k] = np.stack([outside(r, q, k) for r, q in zip(rates, own)])
        out["language", k] = outside(rates, language, k)
        for where, f in PACE_FACTORS.items():
            pace = [quality_rules.pace_bounds(h, ratios, f * k) for h in hists]
            out[where, k] = np.stack([~((lo <= r) & (r <= hi)) | (r > CEILING) for r, (lo, hi) in zip(rates, pace)])
    return out


def scope(n: int, min_clips: int, small: str) -> str:
    """The bounds a speaker of n clips takes, `small` those of one of fewer than `min_clips`."""
    if n >= min_clips:
        return "own"
    return small if n >= quality_rules.PACE_MIN_CLIPS else "language"


def job_bounds(hists, rules: QualityRulesConfig, small: str) -> dict:
    """The job's bounds (`quality_rules.rate_bounds`) with, for `small` "language", no pace bounds, and
    for a pace mode those the job makes at the k that gives its factor."""
    bounds = quality_rules.rate_bounds(hists, rules)
    if small == "language":
        return dict(bounds, **{quality_rules.PACE: {}})
    assert rules.rate_iqr_k is not None
    at = dataclasses.replace(rules, rate_iqr_k=rules.rate_iqr_k * PACE_FACTORS[small] / quality_rules.PACE_K_FACTOR)
    return dict(bounds, **{quality_rules.PACE: quality_rules.rate_bounds(hists, at)[quality_rules.PACE]})


def job_check(rates: np.ndarray, drops: dict) -> None:
    """The clips the job's own code drops in this language at every setting are exactly those of
    `drops` (`judged`); raises otherwise."""
    n = rates.shape[1]
    made = [
        {"id": f"{s}/{i}", "speaker": f"s{s}", "language": "en", "quality": {"speaking_rate": float(rates[s, i])}}
        for s in range(SPEAKERS)
        for i in range(n)
    ]
    hists = quality_rules.rate_histograms(made)
    for k in KS:
        for m in MIN_CLIPS:
            rules = dataclasses.replace(QualityRulesConfig(), rate_iqr_k=k, rate_min_clips=m)
            for small in SMALL:
                gate = quality_rules.QualityGate(rules, 22050, job_bounds(hists, rules, small))
                job = np.array([quality_rules.rate_rejection(c, gate) is not None for c in made]).reshape(SPEAKERS, n)
                if not np.array_equal(job, drops[scope(n, m, small), k]):
                    raise SystemExit(f"k={k} rate_min_clips={m} n={n} {small}: the job's rule drops other clips")


def measure(draw: Callable, trials: int, seed: int, pace_sd: float) -> dict:
    """Per (n, own | language | pace, k): the share of clean speakers losing more than `LOST_SHARE` of their
    clips, the mean share of clean clips lost, and the share of faults kept out."""
    out: dict = {}
    for n in SIZES:
        rng = np.random.default_rng([seed, n])
        broke: dict = {}
        lost: dict = {}
        caught: dict = {}
        faults = faulty_speakers(n)
        for t in range(trials):
            clean = trial(draw, rng, n, pace_sd)
            drops = judged(clean)
            if t == 0:
                job_check(clean, drops)
            faulty = judged(trial(draw, rng, n, pace_sd, faults))
            for key, d in drops.items():
                share = d.sum(axis=1) / n
                broke.setdefault(key, []).append(share > LOST_SHARE)
                lost.setdefault(key, []).append(share)
                caught.setdefault(key, []).append(faulty[key][:faults, 0])
        for (where, k), b in broke.items():
            out[n, where, k] = {
                "speakers_over_5pct": float(np.mean(b)),
                "clips_lost": float(np.mean(lost[where, k])),
                "faults_kept_out": float(np.mean(caught[where, k])),
            }
    return out


def fault_corpora(work: Path, cfg: PreprocessConfig) -> dict:
    """Per corpus of `FAULT_CORPORA` (benchmarks/quality/faults.py's four speakers at 0.75x-1.35x, one
    language) and per setting and bounds of a small speaker (`SMALL`), the rate rule alone applied by the job's own code to every clip's measured
    rate: the 3x-rate faults it keeps out, the clean clips it drops, and the speakers losing more than
    `LOST_SHARE` of their clean clips."""
    from benchmarks.quality import faults
    from melshards.preprocess.clip import audio

    out = {}
    for clean, per_fault in FAULT_CORPORA:
        corpus = work / f"rate-faults-{clean}-{per_fault}"
        rows = faults.build_fault_corpus(corpus, clean, per_fault)
        made = []
        for r in rows:
            y, _ = audio.decode_audio((corpus / r["audio"]).read_bytes(), cfg.audio.sample_rate)
            rate = measured_rate(r["text"], y, cfg)
            made.append({"id": r["id"], "speaker": r["speaker"], "language": "en", "quality": {"speaking_rate": rate}})
        hists = quality_rules.rate_histograms(made)
        fault = {r["id"]: r.get("fault") for r in rows}
        speakers = sorted({r["speaker"] for r in rows})
        for k, m, small in ((k, m, small) for k in KS for m in MIN_CLIPS for small in SMALL):
            rules = dataclasses.replace(QualityRulesConfig(), rate_iqr_k=k, rate_min_clips=m)
            gate = quality_rules.QualityGate(rules, cfg.audio.sample_rate, job_bounds(hists, rules, small))
            dropped = {c["id"] for c in made if quality_rules.rate_rejection(c, gate) is not None}
            rate_faults = [i for i, f in fault.items() if f == "rate"]
            clean_of = {s: [c["id"] for c in made if c["speaker"] == s and fault[c["id"]] is None] for s in speakers}
            lost = {s: sum(i in dropped for i in ids) for s, ids in clean_of.items()}
            out[clean, per_fault, k, m, small] = {
                "clips_per_speaker": len(made) // len(speakers),
                "rate_faults": len(rate_faults),
                "rate_faults_kept_out": sum(i in dropped for i in rate_faults),
                "clean": sum(len(ids) for ids in clean_of.values()),
                "clean_lost": sum(lost.values()),
                "speakers_over_5pct": sum(lost[s] > LOST_SHARE * len(clean_of[s]) for s in speakers),
                "speakers": len(speakers),
            }
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=25, help="languages of 40 speakers per source and size")
    ap.add_argument("--pace-sd", type=float, default=PACE_SD, help="sd of log rate between a language's speakers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work-dir", default=WORK, help="where the fault corpora are written")
    args = ap.parse_args(argv)
    cfg = PreprocessConfig()
    data = data_sources(cfg)
    for name, v in data.items():
        q = np.percentile(v, [0, 25, 50, 75, 100])
        print(f"{name}: {v.size} clips, rate p0 p25 p50 p75 p100 = {' '.join(f'{x:.2f}' for x in q)} symbols/s")
    sources = ("tiny", "joined", "normal", "t3")
    results = {s: measure(drawer(s, data), args.trials, args.seed, args.pace_sd) for s in sources}
    sizes = " ".join(f"{'n=' + str(n):>11}" for n in SIZES)
    print(
        f"\n{SPEAKERS * args.trials} speakers per cell: {args.trials} languages of {SPEAKERS} speakers, pace sd "
        f"{args.pace_sd}\n\n% of clean speakers of n clips losing > 5% of them to the rate rule (mean % of clips "
        "lost), judged by their own bounds or their language's"
    )
    print(f"{'source':<7} {'bounds':<8} {'k':>3} {sizes}")
    for s in sources:
        for where in ("own", *SMALL):
            for k in KS:
                cells = [results[s][n, where, k] for n in SIZES]
                row = " ".join(f"{pct(c['speakers_over_5pct']):>5} ({pct(c['clips_lost']):>3})" for c in cells)
                print(f"{s:<7} {where:<8} {k:>3g} {row}")
    print(f"\n% of 3x-rate faults kept out ({FAULT_SHARE:.0%} of a language's clips, one clip of a speaker at most)")
    print(f"{'source':<7} {'bounds':<8} {'k':>3} {sizes}")
    for s in sources:
        for where in ("own", *SMALL):
            for k in KS:
                row = " ".join(f"{pct(results[s][n, where, k]['faults_kept_out']):>11}" for n in SIZES)
                print(f"{s:<7} {where:<8} {k:>3g} {row}")
    print(
        "\nby setting: % of clean speakers of n clips losing > 5% of them, the worst of the data sources (tiny,\n"
        "joined) / of the models (normal, t3); a speaker with fewer than rate_min_clips takes its language's bounds\n"
        "(small: language) or, from PACE_MIN_CLIPS clips, its median times its language's spread (small: pace at\n"
        "k or 2 k; 2 k is the job's).\n"
        "% of 3x faults kept out, the worst of the sizes and sources. A language with fewer than rate_min_clips\n"
        "rated clips is not judged by bounds: it loses nothing, and its 3x faults are kept out only above the ceiling"
    )
    print(f"{'k':>3} {'min':>3} {'small':<8} {sizes}  3x kept out")
    settings = []
    kinds = {"data": ("tiny", "joined"), "model": ("normal", "t3")}
    for k, m, small in ((k, m, small) for k in KS for m in MIN_CLIPS for small in SMALL):
        worst = {
            (kind, n): max(results[s][n, scope(n, m, small), k]["speakers_over_5pct"] for s in names)
            for kind, names in kinds.items()
            for n in SIZES
        }
        kept = min(results[s][n, scope(n, m, small), k]["faults_kept_out"] for n in SIZES for s in sources)
        row = " ".join(f"{pct(worst['data', n]):>5}/{pct(worst['model', n]):<5}" for n in SIZES)
        print(f"{k:>3g} {m:>3} {small:<8} {row}  {pct(kept):>11}")
        settings.append(
            {
                "rate_iqr_k": k,
                "rate_min_clips": m,
                "small": small,
                **{f"speakers_over_5pct_{kind}": {str(n): round(worst[kind, n], 4) for n in SIZES} for kind in kinds},
                "faults_kept_out_worst": round(kept, 4),
            }
        )
    faults = fault_corpora(Path(args.work_dir), cfg)
    print(
        "\nfault corpora of benchmarks/quality/faults.py (four speakers at 0.75x-1.35x, one language), the rate rule\n"
        "alone by the job's code on the measured rates: 3x faults kept out; clean clips lost; speakers losing > 5%\n"
        "of their clean clips"
    )
    corpora = "  ".join(
        f"{'clean ' + str(c) + ', faults ' + str(f) + ' (' + str(faults[c, f, KS[0], MIN_CLIPS[0], SMALL[0]]['clips_per_speaker']) + ')':<26}"
        for c, f in FAULT_CORPORA
    )
    print(f"{'k':>3} {'min':>3} {'small':<8}  {corpora}")
    for k, m, small in ((k, m, small) for k in KS for m in MIN_CLIPS for small in SMALL):
        cells = []
        for c, f in FAULT_CORPORA:
            x = faults[c, f, k, m, small]
            cells.append(
                f"{str(x['rate_faults_kept_out']) + '/' + str(x['rate_faults']):>5} "
                f"{str(x['clean_lost']) + '/' + str(x['clean']):>7} {str(x['speakers_over_5pct']) + '/' + str(x['speakers']):>4}"
                + " "
                * 8
            )
        print(f"{k:>3g} {m:>3} {small:<8}  " + "  ".join(cells))
    result = {
        "benchmark": "quality_rate_bounds",
        "trials": args.trials,
        "speakers_per_language": SPEAKERS,
        "pace_sd": args.pace_sd,
        "sources": {name: {"clips": int(v.size), "median": round(float(np.median(v)), 3)} for name, v in data.items()},
        "settings": settings,
        "fault_corpora": [
            {"clean": c, "per_fault": f, "rate_iqr_k": k, "rate_min_clips": m, "small": small, **x}
            for (c, f, k, m, small), x in faults.items()
        ],
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
