"""`melshards inspect`'s reference check (`check_references`) on records made here: exact problems."""

import numpy as np

from melshards.shards_schema.shards import check_references


def _rec(clip_id, speaker, mel, ref_id, ref, n, start):
    return {
        "id": clip_id.encode(),
        "speaker": speaker.encode(),
        "mel": mel,
        "mel_len": len(mel),
        "reference_id": ref_id.encode(),
        "reference_mel": ref,
        "reference_len": n,
        "reference_start": start,
    }


def test_a_reference_must_be_its_named_clips_frames_of_the_same_speaker_never_val_in_a_training_record():
    a = np.arange(12, dtype=np.float16).reshape(6, 2)
    b = -np.arange(12, dtype=np.float16).reshape(6, 2)
    pad = np.full((1, 2), -11.5, np.float16)
    good = _rec("a", "s", a, "b", np.concatenate([b[4:], pad]), 2, 4)  # b's last 2 frames, padded
    wrong = _rec("b", "s", b, "a", a[1:4], 3, 0)  # a's frames 1..4, claimed from 0
    stranger = _rec("c", "t", a, "a", a[:3], 3, 0)  # another speaker's clip
    nowhere = _rec("d", "s", a, "x", a[:3], 3, 0)
    rows = [("f", i, "train", r) for i, r in enumerate([good, wrong, stranger, nowhere])]
    problems = check_references(lambda: iter(rows), -11.5)
    assert sorted((p.record, p.what) for p in problems) == [
        (1, "reference_mel is not 'a''s mel over frames 0..3"),
        (2, "reference_id 'a' is of another speaker"),
        (3, "reference_id 'x' names no record of these shards"),
    ]
    # a validation record may name a training clip of its speaker (its only val clip); never the reverse
    own = _rec("a", "s", a, "a", a[:3], 3, 0)
    val_takes_train = _rec("v", "s", b, "a", a[:3], 3, 0)
    train_takes_val = _rec("e", "s", b, "v", b[:3], 3, 0)
    rows = [("f", 0, "train", own), ("f", 1, "train", train_takes_val), ("g", 0, "val", val_takes_train)]
    assert [(p.path, p.record, p.what) for p in check_references(lambda: iter(rows), -11.5)] == [
        ("f", 1, "reference_id 'v' is a val clip: a training record's reference is a training clip")
    ]
    bad_pad = _rec("a", "s", a, "b", np.concatenate([b[4:], pad + 1]), 2, 4)
    assert [p.what for p in check_references(lambda: iter([("f", 0, "train", bad_pad), rows[1]]), -11.5)][:1] == [
        "reference_mel is not padded with -11.5 after reference_len 2"
    ]
