"""TensorBoard scalars: one event-file writer per split (train, val) under MODEL_DIR/tensorboard/."""

from __future__ import annotations

import posixpath

from melshards.train.tf_quiet import tf

TENSORBOARD_DIR = "tensorboard"


class Scalars:
    """`write(split, step, {name: value})` with tf.summary.scalar; `close()` flushes the files."""

    def __init__(self, model_dir: str, splits=("train", "val")):
        self.writers = {
            split: tf.summary.create_file_writer(posixpath.join(model_dir, TENSORBOARD_DIR, split)) for split in splits
        }

    def write(self, split: str, step: int, values: dict) -> None:
        with self.writers[split].as_default():
            for name, value in values.items():
                tf.summary.scalar(name, value, step=step)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
