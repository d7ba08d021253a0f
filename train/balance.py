"""Balanced sampling by speaker or language (`data.balance`, `data.balance_alpha`), in the tf.data graph.

Multilingual and multi-speaker corpora are skewed: a few groups hold most of the clips. Training
draws group g with probability proportional to count_g ** alpha (temperature sampling): alpha 1 is
the corpus as it is, 0 uniform over the groups, in between flattens it. The counts are schema.json's
(`Speaker.clips`, `Language.clips`: train and val together; the validation split is drawn within
each speaker, so the training shares are the same up to rounding).

How: after the record shuffle and the repeat, each serialized record is kept with probability
accept[g] = (target_g / corpus_g) / max over groups, so the kept stream has the target shares. Only
the group id is parsed (one int64 feature of a chunk of records, vectorised), and the uniforms come
from `tf.data.Dataset.random(seed)` zipped with the records: a dataset, so the iterator checkpoint
holds its position and a resumed run keeps exactly the records an uninterrupted one keeps. It reads
max_g(target_g / corpus_g) records per record it keeps (`reads_per_kept`), the least any filter of one
pass over mixed shards can read; docs/train.md compares it with the alternatives.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from melshards.shards_schema import Schema

GROUP_FEATURE = {"speaker": "speaker_id", "language": "language_id"}
# records whose group ids are parsed at once: one vectorised parse instead of one tf.data element each
# (2x the records/s of a per-record filter on 2 CPU cores, measured; docs/train.md)
CHUNK = 64


def group_counts(schema: Schema, balance: str) -> list[int]:
    """Clips per speaker or per language, in id order (schema.json's tables)."""
    table = schema.speakers if balance == "speaker" else schema.languages
    return [x.clips for x in table]


def target_shares(counts: Sequence[int], alpha: float) -> np.ndarray:
    """Each group's share of the balanced stream: count ** alpha, normalised; 0 for a group without clips."""
    counts = np.asarray(counts, np.float64)
    weights = np.where(counts > 0, np.power(np.maximum(counts, 1.0), alpha), 0.0)
    return weights / weights.sum()


def accept_probs(counts: Sequence[int], alpha: float) -> np.ndarray | None:
    """Probability of keeping a record of each group: target share / corpus share, the largest 1.
    None when every group with clips would be kept always (alpha 1, one group): nothing to filter."""
    counts = np.asarray(counts, np.float64)
    if counts.sum() <= 0:
        return None
    corpus = counts / counts.sum()
    ratio = np.divide(target_shares(counts, alpha), corpus, out=np.zeros_like(corpus), where=corpus > 0)
    accept = ratio / ratio.max()
    return None if np.allclose(accept[counts > 0], 1.0) else accept


def reads_per_kept(counts: Sequence[int], accept: np.ndarray | None) -> float:
    """Records read per record kept: 1 / sum_g corpus_g * accept_g (= max_g target_g / corpus_g)."""
    if accept is None:
        return 1.0
    counts = np.asarray(counts, np.float64)
    return float(counts.sum() / (counts * accept).sum())


def describe(schema: Schema, balance: str, alpha: float) -> str:
    """One log line: the groups' shares before and after, and the reading it costs."""
    counts = group_counts(schema, balance)
    names = [x.name if balance == "speaker" else x.code for x in
             (schema.speakers if balance == "speaker" else schema.languages)]
    shares = target_shares(counts, alpha)
    total = max(sum(counts), 1)
    shown = ", ".join(f"{n} {c / total:.1%} -> {s:.1%}" for n, c, s in list(zip(names, counts, shares))[:6])
    more = f", ... ({len(names)} {balance}s)" if len(names) > 6 else ""
    return (f"data.balance {balance}, alpha {alpha:g}: {shown}{more}; reads "
            f"{reads_per_kept(counts, accept_probs(counts, alpha)):.2f} records per record trained on")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the input pipeline needs to balance: the record feature holding the group id, and the
    probability of keeping a record of each group (indexed by that id)."""
    feature: str
    accept: tuple[float, ...]


def plan(schema: Schema, balance: str, alpha: float) -> Plan | None:
    """The balancing of `data.balance` and `data.balance_alpha` over this schema; None: nothing to drop."""
    if balance == "none":
        return None
    accept = accept_probs(group_counts(schema, balance), alpha)
    return None if accept is None else Plan(GROUP_FEATURE[balance], tuple(float(a) for a in accept))


def sampler(plan: Plan, seed: int, deterministic: bool):
    """A tf.data transform of serialized records keeping each with probability accept[its group]."""
    from melshards.train.tf_quiet import tf

    table = tf.constant(plan.accept, tf.float64)
    feature = plan.feature
    spec = {feature: tf.io.FixedLenFeature([], tf.int64)}

    def keep(records, draws):
        groups = tf.io.parse_example(records, spec)[feature]
        uniform = tf.cast(draws % 2**32, tf.float64) / 2.0**32  # Dataset.random's values are uint32
        return tf.boolean_mask(records, uniform < tf.gather(table, groups))

    def apply(ds):
        return (
            # one uniform per record from a seeded dataset: the iterator checkpoint holds its position
            tf.data.Dataset.zip(ds, tf.data.Dataset.random(seed=seed))
            # a chunk's group ids in one vectorised parse of one int64 feature
            .batch(CHUNK)
            .map(keep, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
            # back to single records for the batch of the step
            .unbatch()
        )
    return apply
