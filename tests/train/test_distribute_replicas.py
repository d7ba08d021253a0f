"""tf.distribute with a replica count that does not divide 8 (3 CPU devices; 5, 6 and 7 are checked on
the pure batch sizing, `tests/train/test_buckets.py`), and validation under mirrored.

Its own file (the run helpers are `test_distribute`'s) so that the two test workers, which take a
file each (`--dist loadfile`), run it beside `test_distribute`'s runs instead of after them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.train.conftest import write_config
from tests.train.test_distribute import _finish, _summary, _train


def test_mirrored_on_3_devices_gives_every_bucket_a_batch_they_divide_and_validates(bucketed_dir, tmp_path):
    """gcd(B, 8) alone made bucket batches such as 7 or 8 for B = 3: refused after the model dir was
    written, naming a batch never set. Now every bucket's batch divides, and validation runs under mirrored."""
    # two of the four length buckets, both with validation records: each bucket more is 3 more compiles
    replicas, buckets = 3, "[02]"

    # XLA as by default: each replica's compiled pass, and the compiled eval step, under mirrored
    loop = {"steps": 2, "log_every": 1, "checkpoint_every": 2, "val_every": 2, "jit_compile": True}
    cfg = write_config(tmp_path / "c.yaml", loop=loop)
    val = sorted(bucketed_dir.glob(f"val-b0{buckets}-*.tfrecord"))
    proc = _train(
        bucketed_dir,
        tmp_path / "m",
        cfg,
        tmp_path / "xla",
        "--strategy",
        "mirrored",
        "--cpu-devices",
        str(replicas),
        "--batch-size",
        str(replicas),
        "--val",
        str(bucketed_dir / f"val-b0{buckets}-*"),
        train_glob=f"train-b0{buckets}-*.tfrecord",
    )
    _finish(proc)
    s = _summary(tmp_path / "m")
    assert (s["strategy"], s["replicas"], s["final_step"]) == ("mirrored", replicas, 2)
    batches = [b["batch_size"] for b in s["buckets"]]  # every bucket's, run or not
    assert len(batches) > 1 and [b % replicas for b in batches] == [0] * len(batches)
    val_records = sum(1 for f in val for _ in tf.data.TFRecordDataset(str(f)))
    assert s["final_losses"]["val"]["examples"] == val_records > 0
    assert np.isfinite(s["final_losses"]["val"]["loss"])
