"""tf.distribute with a replica count that does not divide 8 (3 CPU devices; 5, 6 and 7 are checked on
the pure batch sizing, `tests/train/test_buckets.py`), validation under mirrored, and a run resumed on
another strategy.

Its own file (the run helpers are `test_distribute`'s) so that the two test workers, which take a
file each (`--dist loadfile`), run these beside `test_distribute`'s runs instead of after them: the
two were one file of about 9 minutes on one worker, the suite's longest.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.train.conftest import write_config
from tests.train.test_distribute import _finish, _summary, _train


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xla")


def test_mirrored_on_3_devices_gives_every_bucket_a_batch_they_divide_and_validates(bucketed_dir, tmp_path, xla_cache):
    """gcd(B, 8) alone made bucket batches such as 7 or 8 for B = 3: refused after the model dir was
    written, naming a batch never set. Now every bucket's batch divides, and validation runs under mirrored."""
    replicas, buckets = 3, "[0-3]"

    cfg = write_config(tmp_path / "c.yaml", loop={"steps": 2, "log_every": 1, "checkpoint_every": 2, "val_every": 2})
    val = sorted(bucketed_dir.glob(f"val-b0{buckets}-*.tfrecord"))
    proc = _train(
        bucketed_dir,
        tmp_path / "m",
        cfg,
        xla_cache,
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
    batches = [b["batch_size"] for b in s["buckets"]]
    assert len(batches) > 1 and [b % replicas for b in batches] == [0] * len(batches)
    val_records = sum(1 for f in val for _ in tf.data.TFRecordDataset(str(f)))
    assert s["final_losses"]["val"]["examples"] == val_records > 0
    assert np.isfinite(s["final_losses"]["val"]["loss"])


def test_a_run_trained_under_mirrored_resumes_on_one_device(shards_dir, tmp_path, xla_cache):
    """Weights, optimizer and step come back; the input position (not saved under a strategy) is reshuffled."""
    cfg = write_config(tmp_path / "c.yaml", loop={"steps": 4, "log_every": 1, "checkpoint_every": 4, "val_every": 4})
    _finish(_train(shards_dir, tmp_path / "m", cfg, xla_cache, "--strategy", "mirrored", "--cpu-devices", "2"))
    mirrored = tf.train.load_checkpoint(str(tmp_path / "m" / "checkpoints"))
    out = _finish(_train(shards_dir, tmp_path / "m", cfg, xla_cache, "--strategy", "one", "--steps", "8"))
    assert "at step 4" in out and "holds no input position" in out and "reshuffled the input" in out
    s = _summary(tmp_path / "m")
    assert (s["strategy"], s["start_step"], s["final_step"]) == ("one", 4, 8)
    resumed = tf.train.load_checkpoint(str(tmp_path / "m" / "checkpoints"))
    assert resumed.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 8
    assert any(k.startswith("iterator/") for k in resumed.get_variable_to_shape_map())  # one device saves it
    assert int(mirrored.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 4
    assert int(resumed.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 8  # the optimizer resumed
