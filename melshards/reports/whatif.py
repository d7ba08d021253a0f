"""What a different upper cut-off would cost, computed from the exact before-filter histograms.

For an upper percentile q the job's own rule (`melshards.shards_schema.stats.compute_cutoffs`, inverted-CDF
percentiles, so always an observed length) gives the cut-offs and the padded lengths. From those follow the clips kept, the share of each padded tensor that is padding,
and the bytes of one decoded batch.

What is exact and what is not: stats.json holds one histogram per length, not their joint
distribution. Duration and mel frames both grow with the clip's sample count
(`melshards.preprocess.clip.audio.num_frames` is 1 + samples // hop), so the clips below the minimum duration
and those below the lower mel-frame cut-off are both "the shortest clips", and the frame
filters together are exact. Text length is not tied to the sample count, so how many of the
clips the frame filters keep also fail the text cut-off is unknown; `text_over_cut` gives the
most it can be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from melshards.shards_schema.stats import compute_cutoffs, padding_fraction

DEFAULT_WHAT_IF = (90.0, 95.0, 98.0, 99.0, 99.5, 100.0)
FLOAT32_BYTES = 4  # mel is stored as float16 but decode_parsed casts it to float32
INT32_BYTES = 4  # text ids are stored as int16, decoded to int32


def int_hist(hist: Mapping) -> dict[int, int]:
    """stats.json histograms have string keys (JSON); the figures need integer lengths."""
    return {int(v): int(c) for v, c in hist.items()}


def count_below(hist: Mapping[int, int], bound: int) -> int:
    return sum(c for v, c in hist.items() if v < bound)


def count_above(hist: Mapping[int, int], bound: int) -> int:
    return sum(c for v, c in hist.items() if v > bound)


def drop_smallest(hist: Mapping[int, int], k: int) -> dict[int, int]:
    """The histogram without its k smallest values (counting multiplicity)."""
    out = {}
    for v in sorted(hist):
        c = hist[v]
        take = min(k, c)
        k -= take
        if c - take:
            out[v] = c - take
    return out


def hist_padding(hist: Mapping[int, int], padded: int) -> float:
    """`padding_fraction` of the clips of `hist` (length -> clips), each padded to `padded`, rounded to 6
    places as stats.json's figures are."""
    return round(padding_fraction(sum(v * c for v, c in hist.items()), sum(hist.values()) * padded), 6)


def batch_bytes(batch_size: int, mel_frames: int, n_mels: int, text_len: int) -> int:
    """Bytes of one decoded batch of mel (float32) and text ids (int32): the tensors, not activations."""
    return batch_size * (mel_frames * n_mels * FLOAT32_BYTES + text_len * INT32_BYTES)


@dataclasses.dataclass(frozen=True)
class WhatIf:
    mel_q: float
    text_q: float
    mel_cut: int
    text_cut: int
    padded_mel_frames: int
    padded_text_len: int
    clips: int  # clips measured before filtering
    kept: int  # clips passing the minimum duration and both mel-frame cut-offs
    text_over_cut: int  # clips whose text exceeds text_cut: the most the text cut-off drops on top
    mel_padding_fraction: float  # over the kept clips
    text_padding_fraction: float  # over the clips whose text fits text_cut
    batch_bytes: int | None  # None when n_mels is unknown
    is_job: bool = False

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.clips if self.clips else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["kept_fraction"] = round(self.kept_fraction, 6)
        return d


def what_if(
    before: Mapping[str, Mapping[int, int]],
    filter_cfg: Mapping,
    multiple: int,
    mel_q: float,
    text_q: float,
    batch_size: int,
    n_mels: int | None,
    is_job: bool = False,
) -> WhatIf:
    """Figures for upper cut-offs at (mel_q, text_q), the other filter settings as the job had them."""
    mel, text, dur = before["mel_frames"], before["text_len"], before["duration_ms"]
    clips = sum(mel.values())
    cut = compute_cutoffs(
        before,
        float(filter_cfg["min_duration_s"]),
        float(filter_cfg["mel_frames_lower_percentile"]),
        mel_q,
        text_q,
        multiple,
    )
    mel_cut, text_cut = cut.max_mel_frames, cut.max_text_len
    # Both lower filters remove a prefix of the clips ordered by sample count: the union is the longer one.
    shortest = max(count_below(dur, cut.min_duration_ms), count_below(mel, cut.min_mel_frames))
    kept_mel = {v: c for v, c in drop_smallest(mel, shortest).items() if v <= mel_cut}
    text_fits = {v: c for v, c in text.items() if v <= text_cut}
    padded_mel, padded_text = cut.padded_mel_frames, cut.padded_text_len
    return WhatIf(
        mel_q=mel_q,
        text_q=text_q,
        mel_cut=mel_cut,
        text_cut=text_cut,
        padded_mel_frames=padded_mel,
        padded_text_len=padded_text,
        clips=clips,
        kept=sum(kept_mel.values()),
        text_over_cut=clips - sum(text_fits.values()),
        mel_padding_fraction=hist_padding(kept_mel, padded_mel),
        text_padding_fraction=hist_padding(text_fits, padded_text),
        batch_bytes=None if n_mels is None else batch_bytes(batch_size, padded_mel, n_mels, padded_text),
        is_job=is_job,
    )


def what_if_table(stats: dict, qs: tuple[float, ...], batch_size: int, n_mels: int | None) -> list[WhatIf]:
    """One row per q (mel and text cut-offs both at q), plus the job's own pair when not among them.

    Empty when the run kept no clip to measure (no cut-offs in stats.json).
    """
    cut, flt = stats.get("cutoffs"), stats.get("filter") or {}
    before = {k: int_hist(h) for k, h in stats.get("histograms", {}).get("before_filter", {}).items()}
    if not cut or not before.get("mel_frames"):
        return []
    job = (float(flt["mel_frames_upper_percentile"]), float(flt["text_len_upper_percentile"]))
    multiple = int(stats["padding"]["multiple"])
    pairs = sorted({(float(q), float(q)) for q in qs} | {job})
    return [what_if(before, flt, multiple, mq, tq, batch_size, n_mels, is_job=(mq, tq) == job) for mq, tq in pairs]
