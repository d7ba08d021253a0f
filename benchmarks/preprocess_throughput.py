"""Preprocessing throughput: the Beam job with 1 and 2 local workers vs a plain one-core Python loop.

Variants, timed interleaved in every round (the machine is shared: compare ratios, not absolutes):
  loop      in this process, after a warm-up (imports, numba/librosa JIT excluded): for every row
            `clips.measure` (decode + trim + lengths), the job's percentile cut-offs from those
            lengths, then `clips.featurize` (decode + trim + log-mel) for the kept clips: the same
            per-clip work as the job, including its second decode, without Beam, encoding or shards.
  beam1     `python -m preprocess ... --direct_num_workers 1` (FnApiRunner, in-process worker)
  beam2     `... --direct_num_workers 2 --direct_running_mode multi_processing`
  beam1@1, beam2@1   the same two jobs on a 1-clip corpus: the fixed cost of a run (interpreter,
            imports, graph, worker start-up, the job's barriers) measured in the same round.
Beam runs are separate processes, so their wall time includes their whole start-up. Rates:
  clips/s (wall)      N / wall seconds of the run
  clips/s (net)       N / (wall of the N-clip run - wall of the 1-clip run in the same round)
Ratios vs loop are per-round, then the median over rounds. Goals: beam1 >= 0.9x loop, beam2 >= 1.7x.

A one-off breakdown of the loop (read / decode / trim / text / mel / pad+encode / TFRecord write,
ms per clip) shows where single-core time goes; `--profile` also runs the 1-worker job once under
cProfile and prints how its CPU time splits between the per-clip work and the runner.

Run: python -m benchmarks.preprocess_throughput [--clips 1000] [--rounds 3] [--profile]
         [--work-dir /tmp/melshards-bench]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess_scale import WORK, beam_flags, ensure_corpus
from benchmarks.proctree import run_sampled


def corpus_rows(corpus: str) -> list[dict]:
    from preprocess.corpus import parse_ljspeech_line

    lines = [l for l in (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines() if l.strip()]
    rows, seen = [], set()
    for i, line in enumerate(lines):
        try:
            r = parse_ljspeech_line(line, i)
        except ValueError:  # malformed row: the job rejects it too
            continue
        if r["id"] in seen:  # duplicate id: the job keeps the first row
            continue
        seen.add(r["id"])
        wav = os.path.join(corpus, "wavs", r["id"] + ".wav")
        if not os.path.exists(wav):  # the demo corpus also has .flac/.ogg (or nothing)
            wav = next(iter(sorted(Path(corpus, "wavs").glob(r["id"] + ".*"))), None)
        rows.append(dict(r, audio=wav and str(wav)))
    return rows


def one_clip_corpus(src: str, dst: str) -> str:
    """The first row of `src` as its own corpus (the job needs >= 1 good clip to finish)."""
    d = Path(dst)
    if not (d / "metadata.csv").exists():
        (d / "wavs").mkdir(parents=True, exist_ok=True)
        first = (Path(src) / "metadata.csv").read_text(encoding="utf-8").splitlines()[0]
        cid = first.split("|")[0]
        (d / "wavs" / f"{cid}.wav").write_bytes((Path(src) / "wavs" / f"{cid}.wav").read_bytes())
        (d / "metadata.csv").write_text(first + "\n", encoding="utf-8")
    return str(d)


def loop(rows: list[dict], cfg) -> int:
    """measure every row -> cut-offs -> featurize the kept clips; returns rows processed."""
    from preprocess import clips as C
    from preprocess.pipeline import cutoffs_from
    from shards_schema.stats import LENGTH_KEYS
    from shards_schema import Vocabulary

    vocab, measured = Vocabulary(), []
    for r in rows:
        try:
            measured.append(C.measure(r, cfg, vocab))
        except C.ClipRejected:
            pass
    hists = {k: Counter(c[k] for c in measured) for k in LENGTH_KEYS}
    cutoffs = cutoffs_from(hists, cfg)
    for c in measured:
        if cutoffs.reason(c["text_len"], c["mel_frames"], c["duration_ms"]) is None:
            C.featurize(c, cfg)
    return len(rows)


def breakdown(rows: list[dict], cfg, out_path: str) -> dict:
    """ms/clip of each step of the per-clip work, the job's encode and its TFRecord write, one pass."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    from preprocess import audio as A
    from preprocess import clips as C
    from preprocess.pipeline import encode_clip, cutoffs_from
    from shards_schema.stats import LENGTH_KEYS
    from shards_schema import Vocabulary

    vocab = Vocabulary()
    T = Counter()
    hists = {k: Counter() for k in LENGTH_KEYS}
    kept = []
    for r in rows:
        t0 = time.perf_counter()
        data = Path(r["audio"]).read_bytes()
        t1 = time.perf_counter()
        y, _ = A.decode_audio(data, cfg.audio.sample_rate)
        t2 = time.perf_counter()
        A.peak_dbfs(y)
        y = A.trim(y, cfg.audio)
        t3 = time.perf_counter()
        text, ids, _ = C.prepare_text(r["text"], vocab)
        t4 = time.perf_counter()
        mel = A.log_mel(y, cfg.audio.sample_rate, cfg.mel)
        t5 = time.perf_counter()
        T["read"] += t1 - t0
        T["decode"] += t2 - t1
        T["trim"] += t3 - t2
        T["text"] += t4 - t3
        T["mel"] += t5 - t4
        clip = dict(r, text=text, text_ids=ids, text_len=len(ids), mel=mel, split="train",
                    mel_frames=A.num_frames(y.size, cfg.mel.hop_length),
                    duration_ms=int(round(1000 * y.size / cfg.audio.sample_rate)))
        for k in LENGTH_KEYS:
            hists[k][clip[k]] += 1
        kept.append(clip)
    cutoffs = cutoffs_from(hists, cfg)
    kept = [c for c in kept if cutoffs.reason(c["text_len"], c["mel_frames"], c["duration_ms"]) is None]
    # one bucket at the cut-offs: the encode cost does not depend on the number of buckets
    buckets = {"bounds": (cutoffs.padded_mel_frames,), "plan": None, "raised_last_bound": None}
    texts = {0: {cutoffs.max_text_len: 1}}
    encode_clip(kept[0], buckets, texts, cfg)  # warm-up
    with open(out_path, "wb") as f:
        for c in kept:
            t0 = time.perf_counter()
            _, _, _, rec = encode_clip(c, buckets, texts, cfg)
            t1 = time.perf_counter()
            _TFRecordUtil.write_record(f, rec)
            T["encode"] += t1 - t0
            T["write"] += time.perf_counter() - t1
    os.unlink(out_path)
    n = len(rows)
    ms = {k: 1000 * T[k] / n for k in ("read", "decode", "trim", "text", "mel", "encode", "write")}
    # the job decodes and trims twice (measure, then featurize), and reads the file twice
    ms["job_per_clip_estimate"] = 2 * (ms["read"] + ms["decode"] + ms["trim"]) + ms["text"] + ms["mel"] + \
        ms["encode"] + ms["write"]
    ms["loop_per_clip_estimate"] = 2 * (ms["read"] + ms["decode"] + ms["trim"]) + ms["text"] + ms["mel"]
    return {k: round(v, 2) for k, v in ms.items()}


def profile_beam1(corpus: str, out: str) -> dict:
    """Run the 1-worker job once under cProfile, in this process; CPU split by what it was doing."""
    from preprocess.run import run

    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    rc = run(["--input", corpus, "--output", out, "--overwrite", *beam_flags(1)])
    prof.disable()
    wall = time.perf_counter() - t
    assert rc == 0, f"profiled run failed with {rc}"
    st = pstats.Stats(prof)
    cum = {f"{os.path.basename(k[0])}:{k[2]}": v[3] for k, v in st.stats.items()}  # (file, line, fn) -> ct

    def get(name):
        return round(max((v for k, v in cum.items() if k.endswith(name)), default=0.0), 2)

    parts = {
        "total_profiled_s": round(wall, 2),
        "measure (decode+trim+text)": get("clips.py:measure"),
        "featurize (decode+trim+mel)": get("clips.py:featurize"),
        "  of which log_mel": get("audio.py:log_mel"),
        "  of which decode_audio (both passes)": get("audio.py:decode_audio"),
        "  of which trim (both passes)": get("audio.py:trim"),
        "encode_clip (pad + tf.train.Example)": get("pipeline.py:encode_clip"),
        "shard writing (shards.py process)": get("shards.py:process"),
        "_MomentsFn.add_input": get("pipeline.py:add_input"),
    }
    per_clip = parts["measure (decode+trim+text)"] + parts["featurize (decode+trim+mel)"]
    parts["runner + coders + other (total - per-clip work - encode - write - moments)"] = round(
        wall - per_clip - parts["encode_clip (pad + tf.train.Example)"] - parts["shard writing (shards.py process)"]
        - parts["_MomentsFn.add_input"], 2)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    return {"parts_s": parts, "top_tottime": s.getvalue()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000, help="corpus size: the first N clips of the big corpus")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-dir", default=WORK)
    ap.add_argument("--profile", action="store_true", help="also cProfile one 1-worker run (not timed)")
    ap.add_argument("--breakdown-clips", type=int, default=200)
    args = ap.parse_args(argv)

    from preprocess import clips as C
    from preprocess.config import PreprocessConfig

    os.makedirs(args.work_dir, exist_ok=True)
    corpus = ensure_corpus(os.path.join(args.work_dir, f"lj{args.clips}"), args.clips)
    tiny = one_clip_corpus(corpus, os.path.join(args.work_dir, "lj1"))
    cfg = PreprocessConfig()
    rows = corpus_rows(corpus)
    n = len(rows)

    # warm-up: imports, numba JIT in librosa, soxr, first allocations
    from shards_schema import Vocabulary
    for r in rows[:3]:
        C.featurize(C.measure(r, cfg, Vocabulary()), cfg)

    def beam(w, src, tag):
        out = os.path.join(args.work_dir, f"tp-out-{tag}")
        cmd = [sys.executable, "-m", "preprocess", "--input", src, "--output", out, "--overwrite", *beam_flags(w)]
        r = run_sampled(cmd, log_path=os.path.join(args.work_dir, f"tp-{tag}.log"))
        if r["rc"] != 0:
            raise RuntimeError(f"{tag} failed ({r['rc']}), see {args.work_dir}/tp-{tag}.log")
        return r

    variants = ["loop", "beam1", "beam2", "beam1@1", "beam2@1"]
    walls = {k: [] for k in variants}
    cores = {k: [] for k in variants}
    rss = {k: [] for k in variants}
    for rnd in range(args.rounds):
        for v in variants:
            if v == "loop":
                t = time.perf_counter()
                loop(rows, cfg)
                walls[v].append(time.perf_counter() - t)
                continue
            w = int(v[4])
            r = beam(w, tiny if v.endswith("@1") else corpus, v.replace("@", "_at"))
            walls[v].append(r["wall_s"])
            cores[v].append(r["cores_busy_mean"])
            rss[v].append(r["peak_rss_bytes"])
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{k} {walls[k][-1]:.1f}s" for k in variants), flush=True)

    med = statistics.median
    rate = {"loop": [n / s for s in walls["loop"]]}
    for w in (1, 2):
        rate[f"beam{w}_wall"] = [n / s for s in walls[f"beam{w}"]]
        rate[f"beam{w}_net"] = [n / (a - b) for a, b in zip(walls[f"beam{w}"], walls[f"beam{w}@1"])]
    result = {
        "benchmark": "preprocess_throughput", "clips": n, "rounds": args.rounds,
        "wall_s_median": {k: round(med(v), 1) for k, v in walls.items()},
        "clips_per_s_median": {k: round(med(v), 2) for k, v in rate.items()},
        "vs_loop_median": {k: round(med(a / b for a, b in zip(v, rate["loop"])), 3)
                           for k, v in rate.items() if k != "loop"},
        "cores_busy_median": {k: round(med(v), 2) for k, v in cores.items() if v},
        "peak_rss_gib_median": {k: round(med(v) / 2 ** 30, 2) for k, v in rss.items() if v},
        "goals": {"beam1_vs_loop": 0.9, "beam2_vs_loop": 1.7},
    }
    result["breakdown_ms_per_clip"] = breakdown(rows[:args.breakdown_clips], cfg,
                                                os.path.join(args.work_dir, "breakdown.tfrecord"))
    if args.profile:
        prof = profile_beam1(corpus, os.path.join(args.work_dir, "tp-out-profile"))
        result["profile_beam1_s"] = prof["parts_s"]
        print("\ncProfile of one 1-worker run (cumulative seconds):")
        for k, v in prof["parts_s"].items():
            print(f"  {k:<78} {v:>8.2f}")
        print(prof["top_tottime"])

    print(f"\n{n} clips, {args.rounds} interleaved rounds, medians")
    print(f"{'variant':<12} {'wall s':>8} {'clips/s':>8} {'x loop':>7} {'cores busy':>10} {'peak RSS GiB':>12}")
    print(f"{'loop':<12} {result['wall_s_median']['loop']:>8.1f} {result['clips_per_s_median']['loop']:>8.2f} "
          f"{1.0:>7.3f} {'1.00':>10} {'':>12}")
    for w in (1, 2):
        for kind in ("wall", "net"):
            k = f"beam{w}_{kind}"
            wall = result["wall_s_median"][f"beam{w}"] if kind == "wall" else \
                round(med(a - b for a, b in zip(walls[f"beam{w}"], walls[f"beam{w}@1"])), 1)
            print(f"{k:<12} {wall:>8.1f} {result['clips_per_s_median'][k]:>8.2f} "
                  f"{result['vs_loop_median'][k]:>7.3f} {result['cores_busy_median'][f'beam{w}']:>10.2f} "
                  f"{result['peak_rss_gib_median'][f'beam{w}']:>12.2f}")
        print(f"{f'beam{w}@1clip':<12} {result['wall_s_median'][f'beam{w}@1']:>8.1f} {'':>8} {'':>7} "
              f"{result['cores_busy_median'][f'beam{w}@1']:>10.2f} {result['peak_rss_gib_median'][f'beam{w}@1']:>12.2f}")
    print("\nloop breakdown, ms/clip (one pass over the first "
          f"{min(args.breakdown_clips, n)} clips):")
    for k, v in result["breakdown_ms_per_clip"].items():
        print(f"  {k:<24} {v:>8.2f}")
    emit(result)
    return result


if __name__ == "__main__":
    main()
