"""Pitch trackers compared: accuracy on signals of known f0, and CPU seconds per hour of audio.

Trackers: `dio` (WORLD DIO + StoneMask, pyworld) and `pyin` (librosa), as `melshards.preprocess.clip.features.pitch`
runs them on the mel's frames (22,050 Hz, hop 256, fmin 65, fmax 800); `dio_full_rate` is DIO +
StoneMask at WORLD's own settings (DIO's candidate search and StoneMask both at 22,050 Hz), against
which melshards' choices (`features.dio_speed`, `features.refine_rate`) are measured; `yin` (librosa,
no voicing decision: every frame gets an f0) is timed as a speed reference only.

Signals, all of known f0 per frame:
- tones: sine and sawtooth at 80, 110, 165, 220, 330 Hz, 2 s each: median relative error over the
  frames the tracker calls voiced, and voicing recall (share of frames voiced);
- speech-like: a glottal-pulse train (Rosenberg pulses) whose f0 glides 90 -> 240 Hz with 5 Hz
  vibrato, through three formant resonators (vowels changing every 0.3 s), interrupted by 150 ms
  noise bursts (unvoiced) and 100 ms silences, 20 s in all, at 20 dB SNR: gross pitch error (more
  than 20 % off, over frames both truth and tracker call voiced), fine error (median |cents| of the
  others), voicing decision error (frames whose voiced/unvoiced call differs from the truth's, ignoring
  one frame either side of every boundary);
- speed: CPU seconds per hour of audio on the speech-like signal (one core, `--rounds` interleaved
  rounds, median), beside the log-mel of the same audio.

Run: python -m benchmarks.features.pitch_trackers [--rounds 3] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.common import emit

SR, HOP = 22050, 256


def _resonate(x: np.ndarray, freq: float, bandwidth: float) -> np.ndarray:
    """Two-pole resonator (a formant)."""
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bandwidth / SR)
    a = [1.0, -2 * r * np.cos(2 * np.pi * freq / SR), r * r]
    return lfilter([1.0 - r], a, x)


VOWELS = ((700, 1220, 2600), (300, 2300, 3000), (500, 900, 2400), (400, 1900, 2550))


def speech_like(seconds: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(signal, true f0 per mel frame, 0 where unvoiced)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    t = np.arange(n) / SR
    f0 = 90 + 150 * (0.5 - 0.5 * np.cos(2 * np.pi * t / 7.0)) + 4 * np.sin(2 * np.pi * 5 * t)
    voiced = np.ones(n, bool)
    pos = int(0.8 * SR)
    while pos < n:  # alternate: unvoiced noise burst, silence, then voiced again
        voiced[pos : pos + int(0.15 * SR)] = False
        pos += int(rng.uniform(0.7, 1.3) * SR)
    silent = np.zeros(n, bool)
    for start in range(int(0.5 * SR), n, int(2.1 * SR)):
        silent[start : start + int(0.1 * SR)] = True
    phase = np.cumsum(f0 / SR) % 1.0
    pulse = np.where(
        phase < 0.4,
        0.5 * (1 - np.cos(np.pi * phase / 0.4)),
        np.where(phase < 0.56, np.cos(np.pi * (phase - 0.4) / 0.32), 0.0),
    )
    glottal = np.diff(pulse, prepend=0.0)
    out = np.zeros(n)
    seg = int(0.3 * SR)
    for k, start in enumerate(range(0, n, seg)):
        piece = glottal[start : start + seg]
        f1, f2, f3 = VOWELS[k % len(VOWELS)]
        out[start : start + seg] = sum(_resonate(piece, f, 80 + 0.05 * f) for f in (f1, f2, f3))
    out /= np.abs(out).max()
    noise = rng.standard_normal(n)
    out = np.where(voiced, out, 0.3 * noise / np.abs(noise).max())
    out = np.where(silent, 0.0, out)
    out += 10 ** (-20 / 20) * np.sqrt(np.mean(out**2)) * rng.standard_normal(n)  # 20 dB SNR
    frames = 1 + n // HOP
    centre = np.minimum(np.arange(frames) * HOP, n - 1)
    truth = np.where(voiced[centre] & ~silent[centre], f0[centre], 0.0)
    return out.astype(np.float32), truth


def tone(f0: float, kind: str, seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    y = np.sin(2 * np.pi * f0 * t) if kind == "sine" else 2 * ((f0 * t) % 1.0) - 1
    return (0.5 * y).astype(np.float32)


def track(name: str, y: np.ndarray) -> np.ndarray:
    from melshards.preprocess.clip import features
    from melshards.preprocess.config import PitchConfig

    frames = 1 + y.size // HOP
    if name == "dio_full_rate":  # WORLD's own settings: DIO's search and StoneMask at the clip's rate
        import pyworld

        x = y.astype(np.float64)
        f0, times = pyworld.dio(x, SR, f0_floor=65.0, f0_ceil=800.0, frame_period=1000.0 * HOP / SR)
        return features.fit_frames(pyworld.stonemask(x, f0, times, SR), frames)
    if name == "yin":
        from melshards.preprocess.clip.audio import load_librosa

        return load_librosa().yin(y, fmin=65, fmax=800, sr=SR, frame_length=2048, hop_length=HOP, center=True)[:frames]
    return features.pitch(y, SR, HOP, frames, PitchConfig(tracker=name))


def tone_scores(name: str) -> dict:
    errors, recall = [], []
    for f0 in (80, 110, 165, 220, 330):
        for kind in ("sine", "sawtooth"):
            p = track(name, tone(f0, kind))
            v = p[p > 0]
            errors.append(abs(np.median(v) / f0 - 1) if v.size else 1.0)
            recall.append(v.size / p.size)
    return {
        "tone_median_rel_error_pct": round(100 * float(max(errors)), 2),
        "tone_voicing_recall": round(float(min(recall)), 3),
    }


def speech_scores(name: str, y: np.ndarray, truth: np.ndarray) -> dict:
    p = track(name, y)
    edge = np.zeros(truth.size, bool)
    change = np.flatnonzero(np.diff(truth > 0)) + 1
    for c in change:
        edge[max(c - 1, 0) : c + 2] = True
    both = (truth > 0) & (p > 0)
    ratio = p[both] / truth[both]
    gross = np.abs(ratio - 1) > 0.2
    cents = np.abs(1200 * np.log2(ratio[~gross]))
    vde = np.mean(((truth > 0) != (p > 0))[~edge])
    return {
        "gross_error_pct": round(100 * float(gross.mean()), 2),
        "fine_error_cents": round(float(np.median(cents)), 1),
        "voicing_error_pct": round(100 * float(vde), 2),
    }


def cpu_seconds(fn, y) -> float:
    t0 = time.process_time()
    fn(y)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    from melshards.preprocess.clip import audio
    from melshards.preprocess.config import MelConfig

    y, truth = speech_like(args.seconds)
    trackers = ("dio", "dio_full_rate", "pyin")
    for name in trackers:  # warm up: imports, numba compilation of pyin
        track(name, y[:SR])
    with threadpool_limits(1):
        timings: dict[str, list[float]] = {name: [] for name in (*trackers, "yin", "log_mel")}
        for _ in range(args.rounds):
            for name in (*trackers, "yin"):
                timings[name].append(cpu_seconds(lambda x, name=name: track(name, x), y))
            timings["log_mel"].append(cpu_seconds(lambda x: audio.log_mel(x, SR, MelConfig()), y))
    per_hour = {k: round(statistics.median(v) / args.seconds * 3600, 1) for k, v in timings.items()}
    rows = {
        name: {
            **tone_scores(name),
            **speech_scores(name, y, truth),
            "cpu_s_per_audio_hour": per_hour[name],
            "over_log_mel": round(per_hour[name] / per_hour["log_mel"], 2),
        }
        for name in trackers
    }
    rows["yin"] = {
        "cpu_s_per_audio_hour": per_hour["yin"],
        "over_log_mel": round(per_hour["yin"] / per_hour["log_mel"], 2),
    }
    print(
        "| tracker | tones: max median error | tones: min voiced share | speech-like: gross errors | "
        "fine error | voicing errors | CPU s per audio hour | / log-mel |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if name == "yin":
            print(f"| yin (speed only) | – | – | – | – | – | {r['cpu_s_per_audio_hour']} | {r['over_log_mel']} |")
            continue
        print(
            f"| {name} | {r['tone_median_rel_error_pct']} % | {r['tone_voicing_recall']} | {r['gross_error_pct']} % | "
            f"{r['fine_error_cents']} cents | {r['voicing_error_pct']} % | {r['cpu_s_per_audio_hour']} | "
            f"{r['over_log_mel']} |"
        )
    print(f"log-mel of the same audio: {per_hour['log_mel']} CPU s per audio hour")
    emit(
        {
            "benchmark": "pitch_trackers",
            "seconds": args.seconds,
            "rounds": args.rounds,
            "trackers": rows,
            "log_mel_cpu_s_per_audio_hour": per_hour["log_mel"],
        }
    )
    return rows


if __name__ == "__main__":
    main()
