"""A clip's duplicate verdict as it travels on the clip: `DUPLICATE_OF`, the id of the copy of its audio
that is kept. The verdicts are decided in the statistics (`melshards.preprocess.stats.quality_rules.duplicates_of`,
joined with each measured batch by `melshards.preprocess.stats.quality_stage.DuplicateAudio`), put on the
clips when a measured batch is read back (`melshards.preprocess.out_dir.batch_files.read_clips`), and read by the
quality rules (`quality_rules.quality_rejection`: `duplicate_audio`)."""

from __future__ import annotations

from collections.abc import Mapping

DUPLICATE_OF = "duplicate_of"  # on a clip another copy of whose audio is kept: that copy's id


def mark_duplicates(clips: list[dict], duplicates: Mapping[str, str]) -> list[dict]:
    """`clips` with each one in `duplicates` (id -> kept id, `quality_rules.duplicates_of`) marked
    `DUPLICATE_OF`."""
    return [dict(c, **{DUPLICATE_OF: duplicates[c["id"]]}) if c["id"] in duplicates else c for c in clips]
