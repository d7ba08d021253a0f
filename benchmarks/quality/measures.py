"""The cost of the quality measures per clip, measured side by side (interleaved) in one process.

    python -m benchmarks.quality.measures [WAV_DIR] [--rounds N]

Times, per clip of WAV_DIR (default data/ljspeech_tiny/wavs), `clips.analyse_audio` (decode, trim,
STFT, mel) with `quality.measures` off and on, each measure's pure function alone, the audio hash,
DNSMOS (`quality.dnsmos`), and the trim by energy and by webrtcvad. Prints medians in ms per clip and
the ratios; the rounds interleave the configurations so a busy machine slows them alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import statistics
import time

from melshards.preprocess.clip import audio, clips, quality
from melshards.preprocess.config import PreprocessConfig


def _ms(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return 1000 * (time.perf_counter() - start) / len(items)


def _usable(path: str, cfg: PreprocessConfig) -> bool:
    """A clip the job would measure (the shipped corpus holds a few bad ones on purpose)."""
    try:
        clips.trim_span(clips.load_decoded(path, cfg), cfg)
    except clips.ClipRejected:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("wav_dir", nargs="?", default=os.path.join("data", "ljspeech_tiny", "wavs"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    on = PreprocessConfig()
    paths = [p for p in sorted(glob.glob(os.path.join(args.wav_dir, "*.wav"))) if _usable(p, on)]
    off = dataclasses.replace(on, quality=dataclasses.replace(on.quality, measures=False))
    vad = dataclasses.replace(on, audio=dataclasses.replace(on.audio, trim_method="webrtcvad"))
    sr, top_db, n_fft = on.audio.sample_rate, on.audio.trim_top_db, on.mel.n_fft
    decoded = [clips.load_decoded(p, on) for p in paths]
    spans = [clips.trim_span(y, on) for y in decoded]
    mags = [audio.magnitude(y[s:e], on.mel) for y, (s, e) in zip(decoded, spans)]
    seconds = sum(y.size for y in decoded) / sr / len(decoded)
    work = {
        "analyse_audio, measures off": lambda p: clips.analyse_audio(p, off),
        "analyse_audio, measures on (default)": lambda p: clips.analyse_audio(p, on),
        "analyse_audio, measures on, webrtcvad trim": lambda p: clips.analyse_audio(p, vad),
    }
    pure = {
        "audio_hash": lambda i: quality.audio_hash(decoded[i]),
        "longest_pause_s": lambda i: quality.longest_pause_s(decoded[i][slice(*spans[i])], sr, top_db),
        "clipping": lambda i: quality.clipping(decoded[i][slice(*spans[i])]),
        "bandwidth_hz": lambda i: quality.bandwidth_hz(mags[i], sr, n_fft),
        "snr_db": lambda i: quality.snr_db(decoded[i], sr),
        "loudness_lufs": lambda i: quality.loudness_lufs(decoded[i][slice(*spans[i])], sr),
        "peak_dbfs": lambda i: quality.peak_dbfs(decoded[i]),
        "text measures (cer, asr_repeat, foreign_script)": lambda i: quality.measure_quality(
            {}, "Printing, in the only sense.", 28, 2.0, "en", "printing in the only sense"
        ),
        "trim: energy (audio.nonsilent_span)": lambda i: audio.nonsilent_span(decoded[i], top_db),
        "trim: webrtcvad (audio.vad_span)": lambda i: audio.vad_span(decoded[i], sr, 2),
        "dnsmos_ovrl (quality.dnsmos)": lambda i: quality.dnsmos_ovrl(decoded[i][slice(*spans[i])], sr),
    }
    for fn in (*work.values(),):  # warm: imports, numba caches, the DNSMOS sessions
        fn(paths[0])
    for fn in pure.values():
        fn(0)
    times: dict[str, list[float]] = {name: [] for name in (*work, *pure)}
    idx = list(range(len(paths)))
    for _ in range(args.rounds):
        for name, fn in work.items():
            times[name].append(_ms(fn, paths))
        for name, fn in pure.items():
            times[name].append(_ms(fn, idx[: 10 if "dnsmos" in name else None]))
    print(f"{len(paths)} clips, {seconds:.2f} s of audio each on average, {args.rounds} interleaved rounds")
    base = statistics.median(times["analyse_audio, measures off"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:50s} {median:8.3f} ms/clip  {median / base:6.3f}x analyse_audio without measures")


if __name__ == "__main__":
    main()
