"""Quality measures of a clip, computed in the measure stage from the one decode and the mel's STFT
(docs/preprocess.md, Quality measures). Pure functions, one per measure.

`measure_quality` gives every measure of `MEASURES` for one clip, a float each, NaN where the measure
does not apply (`cer` without an `asr_text`, loudness of a clip shorter than a BS.1770 block). The
measures that depend on the audio alone (`AUDIO_MEASURES`, from `audio_quality`) are kept in the
feature cache with the clip's span; those that depend on the text (`TEXT_MEASURES`) are computed every
run, as the text is. `audio_hash` is the content hash of the decoded samples that finds one recording
under two ids.
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
NOISE_BLOCK_S = 0.020  # the blocks the noise floor is measured in
NOISE_SHARE = 0.10  # the quietest share of blocks is the noise floor
SNR_CAP_DB = 100.0  # a digitally silent floor: the SNR is at least this, reported as this
BANDWIDTH_FLOOR_DB = -50.0  # a frequency bin below the strongest by more than this has no real energy
MAX_REPEAT_NGRAM = 4  # word n-grams up to this length are looked for repeated back to back


def speaking_rate(symbols: int, speech_s: float) -> float:
    """Text symbols (characters, or phones in a run with alignments) per second of trimmed speech; NaN
    for no speech."""
    return symbols / speech_s if speech_s > 0 else NAN


def _block_power(y: np.ndarray, block: int) -> np.ndarray:
    """Mean square of each whole block of `block` samples (a partial last block is dropped)."""
    n = y.size // block
    if n == 0:
        return np.zeros(0)
    blocks = y[: n * block].astype(np.float64).reshape(n, block)
    return np.einsum("ij,ij->i", blocks, blocks) / block


def _runs(mask: np.ndarray) -> np.ndarray:
    """Lengths of the runs of True in a boolean array."""
    if not mask.any():
        return np.zeros(0, np.int64)
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def longest_pause_s(y: np.ndarray, sr: int, top_db: float, block_s: float = PAUSE_BLOCK_S) -> float:
    """The longest run of quiet blocks between the first and the last loud block, in seconds: a block
    (of `block_s`, consecutive, not overlapping) is quiet when its power is more than `top_db` below the
    loudest block's (the trim's threshold). 0.0 when no quiet block lies inside the speech."""
    block = max(1, int(round(block_s * sr)))
    power = _block_power(y, block)
    if power.size == 0 or power.max() <= 0:
        return 0.0
    loud = power > power.max() * 10.0 ** (-top_db / 10.0)
    idx = np.flatnonzero(loud)
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


def snr_db(y: np.ndarray, sr: int, block_s: float = NOISE_BLOCK_S, share: float = NOISE_SHARE) -> float:
    """A blind signal-to-noise estimate from the noise floor, in dB: the noise is the mean power of the
    quietest `share` of the blocks (of `block_s`), the signal the mean power of the loudest half less
    the noise. Measured on the untrimmed clip, whose pauses show the floor. Capped at `SNR_CAP_DB`
    (a floor of digital silence); NaN for a clip shorter than two blocks."""
    power = np.sort(_block_power(y, max(1, int(round(block_s * sr)))))
    if power.size < 2:
        return NAN
    noise = float(power[: max(1, int(power.size * share))].mean())
    signal = float(power[power.size // 2 :].mean()) - noise
    if signal <= 0:
        return 0.0 if noise > 0 else NAN
    if noise <= signal * 10.0 ** (-SNR_CAP_DB / 10.0):
        return SNR_CAP_DB
    return 10.0 * math.log10(signal / noise)


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

    from melshards.preprocess.audio import load_librosa

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


# The scripts of a language's letters by its primary subtag, as the first word of a letter's Unicode
# name; a language not listed has the script most of its letters are in.
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{
        code: frozenset({"LATIN"})
        for code in (
            "en de fr es it nl pt pl cs sk sl hr bs ro hu fi et lv lt sv da no nb nn is ga cy eu ca gl tr az "
            "id ms vi tl sw yo ha ig zu xh af sq mt lb eo la"
        ).split()
    },
    **{code: frozenset({"CYRILLIC"}) for code in "ru uk be bg mk kk ky tg mn".split()},
    "sr": frozenset({"CYRILLIC", "LATIN"}),
    "el": frozenset({"GREEK"}),
    **{code: frozenset({"ARABIC"}) for code in "ar fa ur ps ug".split()},
    **{code: frozenset({"HEBREW"}) for code in "he yi".split()},
    "zh": frozenset({"CJK"}),
    "yue": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL", "CJK"}),
    **{code: frozenset({"DEVANAGARI"}) for code in "hi mr ne sa".split()},
    "bn": frozenset({"BENGALI"}),
    "ta": frozenset({"TAMIL"}),
    "te": frozenset({"TELUGU"}),
    "th": frozenset({"THAI"}),
    "ka": frozenset({"GEORGIAN"}),
    "hy": frozenset({"ARMENIAN"}),
}


def letter_script(ch: str) -> str:
    """The script of a letter: the first word of its Unicode name (LATIN, CYRILLIC, CJK, ...)."""
    return unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]


def foreign_script_fraction(text: str, language: str) -> float:
    """The share of the text's letters whose script is not one of the language's (`LANGUAGE_SCRIPTS`
    by primary subtag; else the script most of its letters are in). NaN for a text without letters."""
    scripts = [letter_script(ch) for ch in unicodedata.normalize("NFC", text) if ch.isalpha()]
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
    speech = y[start:end]
    fraction, run = clipping(speech)
    return {
        "longest_pause_s": longest_pause_s(speech, sr, top_db),
        "clipped_fraction": fraction,
        "clipped_run_max": run,
        "bandwidth_hz": bandwidth_hz(mag, sr, n_fft) if mag is not None else NAN,
        "snr_db": snr_db(y, sr),
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
