"""What-if figures: exact values on small histograms, and a direct per-clip computation on the demo run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from melshards.reports.whatif import (
    DEFAULT_WHAT_IF,
    batch_bytes,
    count_above,
    count_below,
    drop_smallest,
    hist_padding,
    int_hist,
    what_if,
    what_if_table,
)

BEFORE = {
    "mel_frames": {10: 1, 20: 2, 30: 3, 40: 4},
    "duration_ms": {100: 1, 250: 2, 350: 3, 460: 4},  # grows with mel frames, as in real runs
    "text_len": {5: 5, 50: 5},
}


def test_histogram_helpers_count_exactly():
    assert count_below(BEFORE["mel_frames"], 30) == 3
    assert count_above(BEFORE["mel_frames"], 30) == 4
    assert drop_smallest({10: 1, 20: 2, 30: 3}, 2) == {20: 1, 30: 3}
    assert drop_smallest({10: 1}, 5) == {}
    assert int_hist({"7": 2}) == {7: 2}


def test_batch_bytes_is_the_size_of_a_decoded_batchs_mel_and_text_ids(shards_dir):
    import melshards

    schema = melshards.read_schema(str(shards_dir))
    batch = next(iter(melshards.dataset(str(shards_dir / "train-*.tfrecord"), 2, shuffle=False)))
    decoded = batch["mel"].numpy().nbytes + batch["text_ids"].numpy().nbytes
    assert batch_bytes(2, schema.max_mel_frames, schema.n_mels, schema.max_text_len) == decoded
    # by hand: 2 x 32 frames x 3 bins of 4-byte floats = 768 bytes, 2 x 8 ids of 4 bytes = 64
    assert batch_bytes(2, 32, 3, 8) == 832


def _filter(min_duration_s: float, lower_q: float) -> dict:
    """The filter section of stats.json; lower_q 20 puts the lower mel cut-off at 20 frames in BEFORE."""
    return {"min_duration_s": min_duration_s, "mel_frames_lower_percentile": lower_q}


def test_what_if_exact_figures_on_a_small_histogram():
    w = what_if(BEFORE, _filter(0.2, lower_q=20), multiple=8, mel_q=50, text_q=50, batch_size=2, n_mels=3)
    assert (w.mel_cut, w.padded_mel_frames, w.text_cut, w.padded_text_len) == (30, 32, 5, 8)
    # one clip under 200 ms, which is also the one under 20 frames; 4 clips above 30 frames
    assert (w.clips, w.kept, w.text_over_cut) == (10, 5, 5)
    assert w.mel_padding_fraction == pytest.approx(1 - (2 * 20 + 3 * 30) / (5 * 32))
    assert w.text_padding_fraction == pytest.approx(1 - 25 / 40)
    assert w.batch_bytes == 832


def test_lower_filters_remove_the_longer_prefix_of_shortest_clips():
    w = what_if(BEFORE, _filter(0.3, lower_q=20), multiple=8, mel_q=100, text_q=100, batch_size=1, n_mels=1)
    assert w.kept == 10 - 3  # three clips are under 300 ms; the single clip under 20 frames is among them


def test_what_if_table_adds_and_marks_the_jobs_own_cutoff():
    stats = {
        "histograms": {"before_filter": {k: {str(v): c for v, c in h.items()} for k, h in BEFORE.items()}},
        "cutoffs": {"min_duration_ms": 0, "min_mel_frames": 10},
        "filter": {
            "mel_frames_upper_percentile": 97.0,
            "text_len_upper_percentile": 90.0,
            "min_duration_s": 0.0,
            "mel_frames_lower_percentile": 0.0,
        },
        "padding": {"multiple": 8},
    }
    rows = what_if_table(stats, (90.0, 100.0), batch_size=1, n_mels=None)
    assert [(r.mel_q, r.text_q, r.is_job) for r in rows] == [(90, 90, False), (97, 90, True), (100, 100, False)]
    assert all(r.batch_bytes is None for r in rows)


def _direct(stats: dict, q: float, batch_size: int, n_mels: int) -> dict:
    """Per-clip arrays from the histograms; duration paired with frames by rank (both grow with samples)."""

    def clips(key):
        h = stats["histograms"]["before_filter"][key]
        return np.sort(np.repeat([int(v) for v in h], [int(c) for c in h.values()]))

    mel, dur, text = clips("mel_frames"), clips("duration_ms"), clips("text_len")
    cut, mult = stats["cutoffs"], stats["padding"]["multiple"]
    mel_cut = int(np.percentile(mel, q, method="inverted_cdf"))
    text_cut = int(np.percentile(text, q, method="inverted_cdf"))
    keep = (dur >= cut["min_duration_ms"]) & (mel >= cut["min_mel_frames"]) & (mel <= mel_cut)
    pad_mel, pad_text = -(-mel_cut // mult) * mult, -(-text_cut // mult) * mult
    fits = text[text <= text_cut]
    return {
        "mel_cut": mel_cut,
        "text_cut": text_cut,
        "padded_mel_frames": pad_mel,
        "padded_text_len": pad_text,
        "kept": int(keep.sum()),
        "text_over_cut": int((text > text_cut).sum()),
        "mel_padding_fraction": 1 - mel[keep].sum() / (keep.sum() * pad_mel),
        "text_padding_fraction": 1 - fits.sum() / (len(fits) * pad_text),
        "batch_bytes": batch_size * (pad_mel * n_mels * 4 + pad_text * 4),
    }


def test_what_if_matches_a_direct_computation_on_the_demo_run(shards_dir):
    stats = json.loads((shards_dir / "stats.json").read_text())
    rows = what_if_table(stats, DEFAULT_WHAT_IF, batch_size=16, n_mels=80)
    assert len(rows) == len(DEFAULT_WHAT_IF)  # the demo's 95/95 is one of them
    for r in rows:
        want = _direct(stats, r.mel_q, 16, 80)
        got = r.to_dict()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, abs=1e-6), (r.mel_q, key)


def test_what_if_at_the_jobs_setting_reproduces_the_job(shards_dir):
    stats = json.loads((shards_dir / "stats.json").read_text())
    job = next(r for r in what_if_table(stats, DEFAULT_WHAT_IF, 32, 80) if r.is_job)
    c, pad = stats["counts"], stats["padding"]
    assert (job.mel_cut, job.text_cut) == (stats["cutoffs"]["max_mel_frames"], stats["cutoffs"]["max_text_len"])
    assert (job.padded_mel_frames, job.padded_text_len) == (pad["max_mel_frames"], pad["max_text_len"])
    # the job drops text-too-long clips only after the frame filters, so they are inside `kept`
    assert job.kept == c["in_shards"] + c["per_reason"].get("text_len_above_cutoff", 0)
    if not c["per_reason"].get("text_len_above_cutoff"):
        after = int_hist(stats["histograms"]["after_filter"]["mel_frames"])
        assert job.mel_padding_fraction == hist_padding(after, pad["max_mel_frames"]) == pad["mel_padding_fraction"]


def test_kept_is_exact_and_text_over_cut_bounds_the_joint_filter(shards_dir):
    """Against the real per-clip lengths: shards (kept clips) plus rejected.jsonl (filtered clips)."""
    import re

    import tensorflow as tf

    stats = json.loads((shards_dir / "stats.json").read_text())
    clips = []  # (text_len, mel_frames, duration_ms or None)
    spec = {"text_len": tf.io.FixedLenFeature([], tf.int64), "mel_len": tf.io.FixedLenFeature([], tf.int64)}
    for path in sorted(shards_dir.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(path)):
            ex = tf.io.parse_single_example(raw, spec)
            clips.append((int(ex["text_len"]), int(ex["mel_len"]), None))
    for line in (shards_dir / "rejected.jsonl").read_text().splitlines():
        m = re.match(r"text_len=(\d+) mel_frames=(\d+) duration_ms=(\d+);", json.loads(line)["detail"])
        if m:
            clips.append(tuple(int(x) for x in m.groups()))
    assert len(clips) == stats["before_filter"]["mel_frames"]["count"]
    cut = stats["cutoffs"]
    for r in what_if_table(stats, DEFAULT_WHAT_IF, 32, 80):
        # clips in shards passed min duration at the job, which is the same for every row
        frame_kept = [
            c
            for c in clips
            if (c[2] is None or c[2] >= cut["min_duration_ms"]) and cut["min_mel_frames"] <= c[1] <= r.mel_cut
        ]
        joint = [c for c in frame_kept if c[0] <= r.text_cut]
        assert r.kept == len(frame_kept)
        assert r.kept - r.text_over_cut <= len(joint) <= r.kept
