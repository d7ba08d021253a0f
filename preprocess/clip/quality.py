"""Quality measures of a clip, computed in the measure stage from the one decode and the mel's STFT
(docs/preprocess.md, Quality measures). Pure functions, one per measure.

`measure_quality` gives every measure of `MEASURES` for one clip, a float each, NaN where the measure
does not apply (`cer` without an `asr_text`, loudness of a clip shorter than a BS.1770 block). The
measures that depend on the audio alone (`AUDIO_MEASURES`, from `audio_quality`) are kept in the
feature cache with the clip's span; those that depend on the text (`TEXT_MEASURES`) are computed every
run, as the text is. `audio_hash` is the content hash of the decoded samples that finds one recording
under two ids.

The quality family, one module each: the measures (`melshards.preprocess.clip.quality`), the rules
(`melshards.preprocess.stats.quality_rules`), the statistics for stats.json
(`melshards.preprocess.stats.quality_stats`), their Beam transforms (`melshards.preprocess.stats.quality_stage`)
and the tables of `melshards stats` (`melshards.reports.quality_tables`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import unicodedata

import numpy as np

MEASURES: tuple[str, ...] = (
    "speaking_rate",
    "longest_pause_s",
    "clipped_fraction",
    "clipped_run_max",
    "bandwidth_hz",
    "snr_db",
    "loudness_lufs",
    "peak_dbfs",
    "cer",
    "asr_repeat",
    "foreign_script_fraction",
)
TEXT_MEASURES: tuple[str, ...] = ("speaking_rate", "cer", "asr_repeat", "foreign_script_fraction")
AUDIO_MEASURES: tuple[str, ...] = tuple(m for m in MEASURES if m not in TEXT_MEASURES)
OPTIONAL_MEASURES: tuple[str, ...] = ("dnsmos_ovrl",)  # computed only when `quality.dnsmos` is on

# The unit of each measure (for tables and plots; docs/preprocess.md defines each).
UNITS: dict[str, str] = {
    "speaking_rate": "symbols/s",
    "longest_pause_s": "s",
    "clipped_fraction": "share of samples",
    "clipped_run_max": "samples",
    "bandwidth_hz": "Hz",
    "snr_db": "dB",
    "loudness_lufs": "LUFS",
    "peak_dbfs": "dBFS",
    "cer": "character error rate",
    "asr_repeat": "repeats",
    "foreign_script_fraction": "share of letters",
    "dnsmos_ovrl": "MOS (1-5)",
}

# Each measure's histogram grid in stats.json (`melshards.shards_schema.stats.measure_key`): keys per
# unit and the side a value goes to, chosen so that its rule's bounds on the grid are answered exactly
# (ceil for a rule dropping values above a bound, floor below). speaking_rate is the rate rule's own
# key (`quality_rules.rate_key`: hundredths, rounded); bandwidth_hz is an STFT bin (`measure_bins`).
GRIDS: dict[str, tuple[float, str]] = {
    "speaking_rate": (100, "round"),
    "longest_pause_s": (100, "ceil"),
    "clipped_fraction": (100_000, "ceil"),
    "clipped_run_max": (1, "exact"),
    "snr_db": (10, "floor"),
    "loudness_lufs": (10, "floor"),
    "peak_dbfs": (10, "floor"),
    "cer": (1000, "ceil"),
    "asr_repeat": (1, "exact"),
    "foreign_script_fraction": (1000, "ceil"),
    "dnsmos_ovrl": (100, "floor"),
}


def measure_bins(sample_rate: int, n_fft: int, dnsmos: bool = False) -> dict[str, tuple[float, str]]:
    """The (keys per unit, side) of the stats.json histogram of every measure a run computes: `GRIDS`
    (dnsmos_ovrl only with `dnsmos`), and bandwidth_hz in STFT bins (n_fft / sample_rate keys per Hz:
    its values are bin centres, so exact)."""
    grids = {m: g for m, g in GRIDS.items() if dnsmos or m not in OPTIONAL_MEASURES}
    return {**grids, "bandwidth_hz": (n_fft / sample_rate, "exact")}


NAN = float("nan")
CLIP_LEVEL = 0.99  # |sample| at or above this share of full scale counts as clipped
PAUSE_BLOCK_S = 0.010  # the blocks a pause is measured in
PAUSE_ABOVE_FLOOR_DB = 6.0  # a block less than this above the noise floor is quiet (`longest_pause_s`)
PAUSE_BRIDGE_S = 0.030  # a loud run shorter than this is no speech: a click, a swell of the noise
NOISE_BLOCK_S = 0.020  # the blocks the noise floor is measured in
NOISE_SHARE = 0.10  # the quietest share of the recorded blocks is the noise floor
# A block whose samples vary about their mean by less than one 16-bit step (RMS 2**-15, -90.3 dBFS) is
# digital silence, no recording: zero padding, a constant (padding less the clip's DC offset), dither.
DIGITAL_SILENCE = 2.0**-30
STEADY = 0.01  # a speech level within this share of the noise floor: a steady sound, no floor to find
BANDWIDTH_FLOOR_DB = -50.0  # a frequency bin below the strongest by more than this has no real energy
MAX_REPEAT_NGRAM = 4  # word n-grams up to this length are looked for repeated back to back


def speaking_rate(symbols: int, speech_s: float) -> float:
    """Text symbols (characters, or phones in a run with alignments) per second of trimmed speech; NaN
    for no speech."""
    return symbols / speech_s if speech_s > 0 else NAN


def _blocks(y: np.ndarray, block: int) -> np.ndarray:
    """The whole blocks of `block` samples, [blocks, block] float64 (a partial last block is dropped)."""
    n = y.size // block
    return y[: n * block].astype(np.float64).reshape(n, block)


def _block_power(blocks: np.ndarray) -> np.ndarray:
    """Mean square of each block of `_blocks`."""
    return np.einsum("ij,ij->i", blocks, blocks) / max(1, blocks.shape[1])


def _runs(mask: np.ndarray) -> np.ndarray:
    """Lengths of the runs of True in a boolean array."""
    if not mask.any():
        return np.zeros(0, np.int64)
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def noise_levels(
    y: np.ndarray, sr: int, block_s: float = NOISE_BLOCK_S, share: float = NOISE_SHARE
) -> tuple[float, float]:
    """(noise floor, speech level) of a clip as mean powers (full scale 1.0), over its recorded blocks
    of `block_s` (consecutive, not overlapping): those that are not `DIGITAL_SILENCE`, so that digital
    silence anywhere in a clip (zero padding, gated pauses) changes neither. The floor is the mean power
    of the quietest `share` of the recorded blocks, the level that of their loudest half. (NaN, NaN)
    where there is no noise floor to find: fewer than two recorded blocks, or a steady sound (a tone,
    a drone) whose level is within `STEADY` of its floor."""
    blocks = _blocks(y, max(1, int(round(block_s * sr))))
    power = _block_power(blocks)
    mean = blocks.mean(axis=1)
    recorded = np.sort(power[power - mean * mean >= DIGITAL_SILENCE])  # the variance about the block's mean
    if recorded.size < 2:
        return NAN, NAN
    floor = float(recorded[: max(1, int(recorded.size * share))].mean())
    level = float(recorded[recorded.size // 2 :].mean())
    if level <= floor * (1.0 + STEADY):
        return NAN, NAN
    return floor, level


def _sustained(loud: np.ndarray, shortest: int) -> np.ndarray:
    """`loud` without its runs of True shorter than `shortest`."""
    if loud.size == 0:
        return loud
    starts = np.concatenate(([0], np.flatnonzero(loud[1:] != loud[:-1]) + 1))
    lengths = np.diff(np.concatenate((starts, [loud.size])))
    return np.repeat(loud[starts] & (lengths >= shortest), lengths)


def longest_pause_s(
    y: np.ndarray,
    sr: int,
    top_db: float,
    levels: tuple[float, float] = (NAN, NAN),
    block_s: float = PAUSE_BLOCK_S,
) -> float:
    """The longest run of quiet blocks between the first and the last loud one, in seconds. Blocks of
    `block_s`, consecutive, not overlapping. A block is quiet when its power is more than `top_db` below
    the loudest block's (the trim's threshold), or less than `PAUSE_ABOVE_FLOOR_DB` above the clip's
    noise floor where its speech level stands at least twice that above the floor (`levels`: the
    clip's `noise_levels`): so a pause of room noise is found in a recording whose floor lies within
    `top_db` of its loudest block. A loud run shorter than `PAUSE_BRIDGE_S` (a click, a swell of the
    noise) counts as quiet. 0.0 when no quiet block lies inside the speech."""
    block = max(1, int(round(block_s * sr)))
    power = _block_power(_blocks(y, block))
    if power.size == 0 or power.max() <= 0:
        return 0.0
    threshold = float(power.max()) * 10.0 ** (-top_db / 10.0)
    floor, level = levels
    above = 10.0 ** (PAUSE_ABOVE_FLOOR_DB / 10.0)
    if level >= floor * above * above:  # False for NaN
        threshold = max(threshold, floor * above)
    loud = _sustained(power > threshold, max(1, int(round(PAUSE_BRIDGE_S * sr / block))))
    idx = np.flatnonzero(loud)
    if idx.size == 0:
        return 0.0
    runs = _runs(~loud[idx[0] : idx[-1] + 1])
    return (int(runs.max()) if runs.size else 0) * block / sr


def clipping(y: np.ndarray, level: float = CLIP_LEVEL) -> tuple[float, float]:
    """(share of samples with |sample| >= level (full scale is 1.0), longest run of such consecutive
    samples, in samples). A hard-clipped recording has runs of samples held at full scale; a clean one
    touches it at most for a sample or two."""
    if y.size == 0:
        return NAN, NAN
    at = np.abs(y) >= level
    runs = _runs(at)
    return float(at.mean()), float(runs.max()) if runs.size else 0.0


def bandwidth_hz(mag: np.ndarray, sr: int, n_fft: int, floor_db: float = BANDWIDTH_FLOOR_DB) -> float:
    """The highest frequency with real energy: the centre of the highest STFT bin whose mean power over
    the frames is within `floor_db` of the strongest bin's. `mag`: |STFT| [1 + n_fft // 2, frames], the
    one the mel is made from. Audio resampled up from 8 or 16 kHz has none above 4 or 8 kHz."""
    power = np.mean(np.square(mag, dtype=np.float64), axis=1) if mag.size else np.zeros(0)
    if power.size == 0 or power.max() <= 0:
        return NAN
    real = np.flatnonzero(power >= power.max() * 10.0 ** (floor_db / 10.0))
    return float(real[-1]) * sr / n_fft


def snr_db(y: np.ndarray, sr: int) -> float:
    """A blind signal-to-noise estimate from the noise floor, in dB: 10 log10((level - floor) / floor)
    of the clip's `noise_levels` (its recorded 20 ms blocks: the loudest half's mean power less the
    floor, over the floor, the quietest tenth's). Measured on the untrimmed clip, whose pauses show the
    floor; digital silence (zero padding) is no floor. At most about 90 dB (a floor at the 16-bit step);
    at or below 0 dB, nothing in the clip stands 3 dB above its quietest tenth: noise as loud as the
    speech, or no speech; NaN where there is no floor to find (a steady sound, digital silence only, a
    clip shorter than two blocks)."""
    return _snr(*noise_levels(y, sr))


def _snr(floor: float, level: float) -> float:
    return NAN if math.isnan(floor) else 10.0 * math.log10((level - floor) / floor)


@functools.lru_cache(maxsize=8)
def _meter(sr: int):
    import pyloudnorm

    return pyloudnorm.Meter(sr)  # ITU-R BS.1770-4, K-weighted, gated


def loudness_lufs(y: np.ndarray, sr: int) -> float:
    """Integrated loudness (ITU-R BS.1770, pyloudnorm) in LUFS; NaN for a clip shorter than one 400 ms
    gating block, -inf-free: a clip below the absolute gate (-70 LUFS) is NaN too."""
    if y.size < int(0.4 * sr) + 1:
        return NAN
    value = float(_meter(sr).integrated_loudness(y.astype(np.float64)))
    return value if math.isfinite(value) else NAN


def peak_dbfs(y: np.ndarray) -> float:
    """The largest |sample| in dB relative to full scale (1.0); NaN for silence."""
    peak = float(np.max(np.abs(y))) if y.size else 0.0
    return 20.0 * math.log10(peak) if peak > 0 else NAN


def loudness_gain(y: np.ndarray, sr: int, target_lufs: float) -> float:
    """The linear gain that brings a clip's integrated loudness to `target_lufs` (1.0 where it cannot
    be measured)."""
    measured = loudness_lufs(y, sr)
    return 1.0 if math.isnan(measured) else 10.0 ** ((target_lufs - measured) / 20.0)


DNSMOS_RATE = 16000  # the rate the DNSMOS models take


def dnsmos_ovrl(y: np.ndarray, sr: int) -> float:
    """DNSMOS P.835 overall quality (1-5; speechmos' ONNX models run by onnxruntime) of a clip, listened
    to at 16 kHz (soxr); the model scores 9 s windows, so a shorter clip is repeated to fill one."""
    import soxr

    from melshards.preprocess.clip.audio import load_librosa

    load_librosa()  # speechmos imports librosa: after its compiled modules are cached (audio.load_librosa)
    from speechmos import dnsmos

    x = y if sr == DNSMOS_RATE else soxr.resample(y, sr, DNSMOS_RATE)
    return float(dnsmos.run(np.clip(x, -1.0, 1.0).astype(np.float32), DNSMOS_RATE)["ovrl_mos"])


_PUNCT = re.compile(r"[^\w\s]|_", re.UNICODE)


def normalise_words(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed: what `cer` compares."""
    return " ".join(_PUNCT.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split())


def cer(text: str, asr_text: str | None) -> float:
    """Character error rate of the ASR transcript against the text (jiwer), both `normalise_words`-ed:
    (substitutions + deletions + insertions) / characters of the text. NaN without an asr_text."""
    if not asr_text or not asr_text.strip():
        return NAN
    import jiwer

    reference, hypothesis = normalise_words(text), normalise_words(asr_text)
    if not reference:
        return NAN
    return float(jiwer.cer(reference, hypothesis))


def asr_repeat(text: str, max_n: int = MAX_REPEAT_NGRAM) -> float:
    """The most times any phrase of 1..max_n words occurs back to back (1.0: nothing repeated; "go go
    go" is 3.0): ASR models loop on a phrase when they hallucinate. NaN for no words."""
    words = normalise_words(text).split()
    if not words:
        return NAN
    best = 1
    for n in range(1, max_n + 1):
        for start in range(n):
            grams = [tuple(words[i : i + n]) for i in range(start, len(words) - n + 1, n)]
            run = 1
            for a, b in zip(grams, grams[1:]):
                run = run + 1 if a == b else 1
                best = max(best, run)
    return float(best)


# The scripts of a language's letters by its primary subtag, as ISO 15924 codes of the Unicode Script
# property (`letter_script`); a language not listed has the script most of its letters are in.
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{
        code: frozenset({"Latn"})
        for code in (
            "en de fr es it nl pt pl cs sk sl hr bs ro hu fi et lv lt sv da no nb nn is ga cy eu ca gl tr az "
            "id ms vi tl sw yo ha ig zu xh af sq mt lb eo la"
        ).split()
    },
    **{code: frozenset({"Cyrl"}) for code in "ru uk be bg mk kk ky tg mn".split()},
    "sr": frozenset({"Cyrl", "Latn"}),
    "el": frozenset({"Grek"}),
    **{code: frozenset({"Arab"}) for code in "ar fa ur ps ug".split()},
    **{code: frozenset({"Hebr"}) for code in "he yi".split()},
    "zh": frozenset({"Hani"}),
    "yue": frozenset({"Hani"}),
    "ja": frozenset({"Hani", "Hira", "Kana"}),
    "ko": frozenset({"Hang", "Hani"}),
    **{code: frozenset({"Deva"}) for code in "hi mr ne sa".split()},
    "bn": frozenset({"Beng"}),
    "ta": frozenset({"Taml"}),
    "te": frozenset({"Telu"}),
    "th": frozenset({"Thai"}),
    "ka": frozenset({"Geor"}),
    "hy": frozenset({"Armn"}),
}
SCRIPTLESS = frozenset({"Zyyy", "Zinh", "Zzzz"})  # Common, Inherited, Unknown: of no one language


@functools.lru_cache(maxsize=4096)
def letter_script(ch: str) -> str:
    """The Unicode Script property of a character as its ISO 15924 code ("Latn", "Cyrl", "Hani", ...;
    "Zyyy" for Common, "Zinh" for Inherited), from fontTools' copy of the Unicode Character Database."""
    from fontTools import unicodedata as ucd

    return str(ucd.script(ch))


def foreign_script_fraction(text: str, language: str) -> float:
    """The share of the text's letters whose script is not one of the language's (`LANGUAGE_SCRIPTS`
    by primary subtag; else the script most of its letters are in). The text is NFKC-normalised first
    (fullwidth "Ａ" is "A", "º" is "o"); letters of the Common or Inherited script (the prolonged sound
    mark "ー", a modifier letter) belong to no one language and are not counted. NaN for a text without
    a counted letter."""
    scripts = [letter_script(ch) for ch in unicodedata.normalize("NFKC", text) if ch.isalpha()]
    scripts = [s for s in scripts if s not in SCRIPTLESS]
    if not scripts:
        return NAN
    own = LANGUAGE_SCRIPTS.get(language.strip().replace("_", "-").lower().split("-")[0])
    if own is None:
        counts: dict[str, int] = {}
        for s in scripts:
            counts[s] = counts.get(s, 0) + 1
        own = frozenset({max(counts, key=lambda s: (counts[s], s))})
    return sum(s not in own for s in scripts) / len(scripts)


def audio_hash(samples: np.ndarray) -> str:
    """SHA-256 of the decoded samples (mono float32 at the run's rate, DC offset removed, untrimmed),
    hex: one recording under two ids, or stored in two containers (WAV and FLAC, other tags), has one
    hash, where a hash of the files' bytes would differ."""
    return hashlib.sha256(np.ascontiguousarray(samples, dtype="<f4").tobytes()).hexdigest()


def audio_quality(
    y: np.ndarray,
    start: int,
    end: int,
    sr: int,
    mag: np.ndarray | None,
    n_fft: int,
    top_db: float,
    loudness: bool = True,
) -> dict[str, float]:
    """The `AUDIO_MEASURES` of a decoded clip `y` whose speech is `y[start:end]`; `mag`: the |STFT| of
    the speech the mel is made from (None: bandwidth NaN, a run that computes no mel); `loudness`
    False: loudness_lufs NaN (not measured)."""
    speech, levels = y[start:end], noise_levels(y, sr)
    fraction, run = clipping(speech)
    return {
        "longest_pause_s": longest_pause_s(speech, sr, top_db, levels),
        "clipped_fraction": fraction,
        "clipped_run_max": run,
        "bandwidth_hz": bandwidth_hz(mag, sr, n_fft) if mag is not None else NAN,
        "snr_db": _snr(*levels),
        "loudness_lufs": loudness_lufs(speech, sr) if loudness else NAN,
        "peak_dbfs": peak_dbfs(y),
    }


def measure_quality(
    audio: dict[str, float], text: str, symbols: int, speech_s: float, language: str, asr_text: str | None = None
) -> dict[str, float]:
    """Every measure of `MEASURES` for one clip, in that order (then any `OPTIONAL_MEASURES` that
    `audio` holds): the audio measures `audio_quality` gave, with those of its text. `text`: the row's
    transcript; `symbols`: its length in the run's text units; `speech_s`: the trimmed speech's seconds.
    The ASR-text rules (`asr_repeat`, `foreign_script_fraction`) read `asr_text` where the corpus gives
    one, else the text."""
    checked = asr_text if asr_text and asr_text.strip() else text
    out = {
        "speaking_rate": speaking_rate(symbols, speech_s),
        **{m: float(audio.get(m, NAN)) for m in AUDIO_MEASURES},
        "cer": cer(text, asr_text),
        "asr_repeat": asr_repeat(checked),
        "foreign_script_fraction": foreign_script_fraction(checked, language),
    }
    ordered = {m: out[m] for m in MEASURES}
    ordered.update({m: float(audio[m]) for m in OPTIONAL_MEASURES if m in audio})
    return ordered
