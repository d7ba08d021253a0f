"""Phone durations from Montreal Forced Aligner TextGrids: reading with praatio, the silence policy,
the rounding rule (exact sums, no drift), trimming, mismatches and where TextGrids are found."""

import numpy as np
import pytest
from praatio import textgrid

from melshards.preprocess.clip import alignments

SR, HOP = 22050, 256


def textgrid_bytes(tmp_path, phones, end, words=None, fmt="long_textgrid", name="x") -> bytes:
    tg = textgrid.Textgrid()
    if words is not False:
        tg.addTier(textgrid.IntervalTier("words", words or [(phones[0][0], phones[-1][1], "w")], 0, end))
    tg.addTier(textgrid.IntervalTier("phones", phones, 0, end))
    path = tmp_path / f"{name}.TextGrid"
    tg.save(str(path), format=fmt, includeBlankSpaces=True)
    return path.read_bytes()


@pytest.mark.parametrize("fmt", ["long_textgrid", "short_textgrid"])
def test_gaps_and_silence_labels_become_one_merged_sil_and_spn_stays(tmp_path, fmt):
    phones = [
        (0.10, 0.20, "HH"),
        (0.20, 0.30, "AY1"),
        (0.30, 0.35, "sp"),
        (0.35, 0.40, "sil"),
        (0.45, 0.50, "spn"),
        (0.50, 0.60, "B"),
    ]
    a = alignments.read_phones(textgrid_bytes(tmp_path, phones, 1.0, fmt=fmt), "x")
    assert [p[2] for p in a.phones] == ["sil", "HH", "AY1", "sil", "spn", "B", "sil"]
    assert a.phones[3][:2] == pytest.approx((0.30, 0.45))  # sp + sil + the gap after it: one silence
    assert a.phones[0][:2] == (0.0, 0.10) and a.phones[-1][:2] == (0.60, 1.0) and a.end_s == 1.0


def test_durations_follow_the_frame_centre_rule_exactly():
    # untrimmed: sil 0-0.1 s, A 0.1-0.25, B 0.25-0.4, sil 0.4-0.5; trimmed from sample 2205 (0.1 s)
    a = alignments.Alignment(((0.0, 0.1, "sil"), (0.1, 0.25, "A"), (0.25, 0.4, "B"), (0.4, 0.5, "sil")), 0.5)
    trimmed = 6615  # 0.1..0.4 s
    phones, d = alignments.phone_durations(a, 2205, trimmed, SR, HOP)
    frames = 1 + trimmed // HOP  # 26
    # A ends at sample 5512 - 2205 = 3307: ceil(3307/256) = 13 frames (centres 0..3072); B gets the rest
    assert phones == ("A", "B") and d.tolist() == [13, frames - 13] and d.dtype == np.int32


def test_an_edge_silence_inside_the_trimmed_audio_keeps_its_frames():
    a = alignments.Alignment(((0.0, 0.2, "sil"), (0.2, 0.5, "A"), (0.5, 0.6, "sil")), 0.6)
    phones, d = alignments.phone_durations(a, 0, int(0.6 * SR), SR, HOP)
    assert phones == ("sil", "A", "sil") and d.sum() == 1 + int(0.6 * SR) // HOP and d[0] == 18


def test_durations_sum_to_the_frames_for_random_alignments_and_trims():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        cuts = np.sort(rng.uniform(0, 5.0, n - 1))
        end = 5.0
        bounds = np.concatenate([[0.0], cuts, [end]])
        labels = [("sil" if rng.random() < 0.2 else f"P{i}") for i in range(n)]
        a = alignments.Alignment(
            tuple((float(s), float(e), lab) for s, e, lab in zip(bounds[:-1], bounds[1:], labels)), end
        )
        start = int(rng.integers(0, SR // 2))
        trimmed = int(rng.integers(SR, int(end * SR) - start))
        phones, d = alignments.phone_durations(a, start, trimmed, SR, HOP)
        assert d.sum() == 1 + trimmed // HOP and (d >= 0).all() and len(phones) == len(d)


def test_boundaries_never_drift_over_a_long_clip():
    n, end = 600, 60.0
    bounds = np.linspace(0, end, n + 1)
    a = alignments.Alignment(tuple((float(s), float(e), "A") for s, e in zip(bounds[:-1], bounds[1:])), end)
    trimmed = int(end * SR)
    _, d = alignments.phone_durations(a, 0, trimmed, SR, HOP)
    exact = bounds[1:] * SR / HOP  # where each phone's end falls, in frames
    assert np.all(np.abs(np.cumsum(d)[:-1] - exact[:-1]) <= 1)


def test_a_textgrid_ending_beyond_the_tolerance_is_a_mismatch():
    a = alignments.Alignment(((0.0, 2.0, "A"),), 2.0)
    assert alignments.mismatch(a, int(2.015 * SR), SR, 20.0) is None
    detail = alignments.mismatch(a, int(2.5 * SR), SR, 20.0)
    assert "2.000 s" in detail and "2.500 s" in detail and "20 ms" in detail


def test_a_missing_tier_or_garbage_is_an_alignment_error(tmp_path):
    with pytest.raises(alignments.AlignmentError, match="no 'words' tier"):
        alignments.read_phones(textgrid_bytes(tmp_path, [(0.1, 0.2, "A")], 1.0, words=False), "x.TextGrid")
    with pytest.raises(alignments.AlignmentError, match="not a TextGrid"):
        alignments.read_phones(b"\x00\x01 not a textgrid", "x.TextGrid")


def long_textgrid_text(phones, end) -> bytes:
    """A long-format TextGrid written by hand: praatio's writer refuses a zero-length interval, MFA's need not."""

    def tier(name, intervals):
        items = "".join(
            f"            intervals [{i + 1}]:\n                xmin = {s}\n                xmax = {e}\n"
            f'                text = "{label}"\n'
            for i, (s, e, label) in enumerate(intervals)
        )
        return (
            f'        class = "IntervalTier"\n        name = "{name}"\n        xmin = 0\n        xmax = {end}\n'
            f"        intervals: size = {len(intervals)}\n{items}"
        )

    return (
        f'File type = "ooTextFile"\nObject class = "TextGrid"\n\nxmin = 0\nxmax = {end}\ntiers? <exists>\n'
        f"size = 2\nitem []:\n    item [1]:\n{tier('words', [(0, end, 'w')])}"
        f"    item [2]:\n{tier('phones', phones)}"
    ).encode()


@pytest.mark.parametrize("phones", [[(0.0, 0.5, "sil"), (0.5, 0.7, "sp"), (0.7, 1.0, "")], []])
def test_a_phones_tier_of_silence_alone_is_an_unusable_alignment_not_the_text_sil(tmp_path, phones):
    import dataclasses

    from melshards.preprocess.clip.clips import ClipRejected, read_alignment
    from melshards.preprocess.config import AlignmentsConfig, PreprocessConfig

    data = long_textgrid_text(phones, 1.0)
    with pytest.raises(alignments.AlignmentError, match="the phones tier holds only silence"):
        alignments.read_phones(data, "x.TextGrid")
    (tmp_path / "c1.TextGrid").write_bytes(data)
    cfg = dataclasses.replace(PreprocessConfig(), alignments=AlignmentsConfig(dir=str(tmp_path)))
    with pytest.raises(ClipRejected) as e:
        read_alignment({"id": "c1", "speaker": "s"}, cfg)
    assert e.value.reason == "alignment_mismatch" and "the aligner found no speech" in e.value.detail


def test_a_zero_length_phone_stays_in_the_sequence_with_zero_frames():
    data = long_textgrid_text(
        [(0.1, 0.3, "HH"), (0.3, 0.3, "AH0"), (0.3, 0.3, ""), (0.3, 0.6, "L"), (0.6, 0.6, "sil"), (0.6, 0.9, "OW1")],
        1.0,
    )
    a = alignments.read_phones(data, "x.TextGrid")
    assert [p[2] for p in a.phones] == ["sil", "HH", "AH0", "L", "OW1", "sil"]  # a zero-length silence is no phone
    phones, d = alignments.phone_durations(a, 0, SR, SR, HOP)
    assert phones == ("sil", "HH", "AH0", "L", "OW1", "sil") and d[2] == 0 and d.sum() == 1 + SR // HOP


def test_textgrids_are_found_beside_or_in_the_speakers_folder(tmp_path):
    (tmp_path / "a.TextGrid").write_text("x")
    (tmp_path / "spk").mkdir()
    (tmp_path / "spk" / "b.TextGrid").write_text("x")
    assert alignments.textgrid_path(str(tmp_path), "a", "spk") == str(tmp_path / "a.TextGrid")
    assert alignments.textgrid_path(str(tmp_path), "b", "spk") == str(tmp_path / "spk" / "b.TextGrid")
    assert alignments.textgrid_path(str(tmp_path), "c", "spk") is None


def test_a_clip_prefixed_by_a_merge_finds_its_textgrid_by_the_id_and_speaker_its_input_gives(tmp_path):
    """Two inputs share clip 0001 and speaker spk: both are prefixed (`a/0001`, `a/spk`), and MFA wrote
    DIR/spk/0001.TextGrid and DIR/0002.TextGrid as the inputs name them."""
    import dataclasses

    from melshards.preprocess.clip.clips import ClipRejected, read_alignment
    from melshards.preprocess.config import AlignmentsConfig, PreprocessConfig
    from melshards.preprocess.inputs.merge import MergedInputs
    from melshards.preprocess.inputs.rows import row
    from melshards.preprocess.inputs.working_set import WorkingSet

    tg = textgrid_bytes(tmp_path, [(0.1, 0.4, "HH"), (0.4, 0.8, "AY1")], 1.0)
    (tmp_path / "tg" / "spk").mkdir(parents=True)
    (tmp_path / "tg" / "spk" / "0001.TextGrid").write_bytes(tg)
    (tmp_path / "tg" / "0002.TextGrid").write_bytes(tg)
    cfg = dataclasses.replace(PreprocessConfig(), alignments=AlignmentsConfig(dir=str(tmp_path / "tg")))
    a = [row("0001", "Hi.", "a.wav", 0, speaker="spk"), row("0002", "Hi.", "b.wav", 1, speaker="spk")]
    b = [row("0001", "Hi.", "c.wav", 0, speaker="spk")]
    with WorkingSet() as working_set:
        rows = list(MergedInputs([("a", a), ("b", b)], working_set).rows())
    assert [(r["id"], r["speaker"]) for r in rows] == [("a/0001", "a/spk"), ("0002", "a/spk"), ("b/0001", "b/spk")]
    assert [[p[2] for p in read_alignment(r, cfg).phones] for r in rows] == [["sil", "HH", "AY1", "sil"]] * 3
    with pytest.raises(ClipRejected, match=r"no 0003.TextGrid in .* \(nor in its 'spk' folder\)"):
        read_alignment(dict(rows[2], id="b/0003", given_id="0003"), cfg)
