"""The filter's one rule on a measured clip (stage 5): a speaker with too few clips (`tables`), the
percentile cut-offs (`melshards.shards_schema.stats.Cutoffs`), the quality rules (`quality_rules`). The
buckets are chosen from the clips it keeps (`choose_buckets`), the duplicate verdicts count only the copies
it keeps (`quality_stage.DuplicateAudio`), and the writer drops the clips it rejects (`filter_and_write`)."""

from __future__ import annotations

from melshards.preprocess.inputs.rows import reject
from melshards.preprocess.stats import quality_rules
from melshards.preprocess.stats.tables import speaker_rejection_detail
from melshards.shards_schema.stats import Cutoffs


def filter_rejection(
    clip: dict, cutoffs: Cutoffs, tables: dict, gate: quality_rules.QualityGate | None = None
) -> dict | None:
    """The filter's rule: a speaker with too few clips (`tables`), then the percentile cut-offs
    (`Cutoffs.reason`), then the quality rules and last a duplicate recording
    (`quality_rules.quality_rejection`, with `gate`; the duplicate verdict is on the clip once its
    batch is joined with them, `quality_stage.DuplicateAudio`). None if it keeps the clip, else the
    clip's rejected.jsonl entry (a clip is dropped, never truncated). The cut-offs come first: a clip
    outside them keeps the reason it had before the quality rules existed."""
    speaker = speaker_rejection_detail(clip, tables)
    if speaker is not None:
        return reject(clip["id"], "speaker_too_few_clips", speaker)
    reason = cutoffs.reason(clip["text_len"], clip["mel_frames"], clip["duration_ms"], clip["language"])
    if reason is not None:
        detail = (
            f"text_len={clip['text_len']} mel_frames={clip['mel_frames']} duration_ms={clip['duration_ms']}; "
            f"kept: duration_ms>={cutoffs.min_duration_ms}, "
            f"{cutoffs.min_mel_frames}<=mel_frames<={cutoffs.max_mel_frames}, "
            f"text_len<={cutoffs.text_limit(clip['language'])} ({clip['language']})"
        )
        return reject(clip["id"], reason, detail)
    bad = quality_rules.quality_rejection(clip, gate) if gate is not None else None
    return reject(clip["id"], *bad) if bad is not None else None
