"""Balanced sampling by speaker or language (`data.balance`, `data.balance_alpha`), in the tf.data graph.

Multilingual and multi-speaker corpora are skewed: a few groups hold most of the clips. Training
draws group g with probability proportional to count_g ** alpha (temperature sampling): alpha 1 is
the corpus as it is, 0 uniform over the groups, in between flattens it. The counts are the training
split's, per length bucket (schema.json `Bucket.groups`, 3.2); a schema.json written before 3.2 has
only the tables' `clips` (train and val together), used as they are.

How: after the record shuffle and the repeat, each serialized record is kept with probability
accept[g] = (target_g / corpus_g) / max over groups, so the records kept have the target shares as
long as every bucket supplies records in proportion to what it keeps: bucket b keeps the share
kept_b = sum_g n[b, g] accept[g] / sum_g n[b, g] of its records (`kept_fractions`), and the bucket
schedule (train/buckets.py) and `melshards.dataset`'s interleave weigh each bucket by its records
times kept_b, not by its records (a bucket of a long-clip speaker and one of a short-clip speaker
would otherwise be drawn by their raw sizes, whatever the filter keeps). `realised_shares` gives the
shares a given draw of the buckets yields; the trainer logs them. Only the group id is parsed (one
int64 feature of a chunk of records, vectorised), and the uniforms come from
`tf.data.Dataset.random(seed)` zipped with the records: a dataset, so the iterator checkpoint holds its
position and a resumed run keeps exactly the records an uninterrupted one keeps. It reads
max_g(target_g / corpus_g) records per record it keeps (`reads_per_kept`), the least any filter of one
pass over mixed shards can read; docs/train.md compares it with the alternatives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from melshards.shards_schema import Schema

GROUP_FEATURE = {"speaker": "speaker_id", "language": "language_id"}
# records whose group ids are parsed at once: one vectorised parse instead of one tf.data element each
# (docs/performance.md#input-pipeline)
CHUNK = 64


def _table(schema: Schema, balance: str):
    return schema.speakers if balance == "speaker" else schema.languages


def bucket_counts(schema: Schema, balance: str, split: str = "train") -> np.ndarray | None:
    """[K, G]: the records of each speaker (or language) id in each bucket's `split`; None when
    schema.json does not hold them (written before 3.2)."""
    rows = [b.group_counts(split, balance) for b in schema.buckets]
    width = len(_table(schema, balance))
    if any(r is None or len(r) != width for r in rows):
        return None
    return np.asarray(rows, np.float64).reshape(len(rows), width)


def group_counts(schema: Schema, balance: str) -> list[int]:
    """Training records per speaker or per language, in id order: every bucket's training counts
    summed (a speaker held out for validation has none); before 3.2, the tables' clips (train + val)."""
    per_bucket = bucket_counts(schema, balance)
    if per_bucket is not None:
        return [int(n) for n in per_bucket.sum(axis=0)]
    return [x.clips for x in _table(schema, balance)]


def kept_fractions(per_bucket: np.ndarray, accept: np.ndarray | None) -> np.ndarray:
    """The share of each bucket's records the filter keeps, sum_g n[b, g] accept[g] / sum_g n[b, g]
    (1 for every bucket when `accept` is None, and for a bucket without records)."""
    per_bucket = np.asarray(per_bucket, np.float64)
    totals = per_bucket.sum(axis=1)
    if accept is None:
        return np.ones(len(per_bucket))
    kept = per_bucket @ np.asarray(accept, np.float64)
    return np.divide(kept, totals, out=np.ones_like(kept), where=totals > 0)


def realised_shares(per_bucket: np.ndarray, accept: np.ndarray | None, drawn: Sequence[float]) -> np.ndarray:
    """Each group's share of the records trained on when bucket b supplies drawn[b] records (after
    the filter): bucket b's kept records are n[b, g] accept[g] of group g, in those proportions."""
    per_bucket = np.asarray(per_bucket, np.float64)
    a = np.ones(per_bucket.shape[1]) if accept is None else np.asarray(accept, np.float64)
    kept = per_bucket * a  # [K, G]
    within = np.divide(
        kept, kept.sum(axis=1, keepdims=True), out=np.zeros_like(kept), where=kept.sum(axis=1, keepdims=True) > 0
    )
    mix = np.asarray(drawn, np.float64) @ within
    return mix / mix.sum() if mix.sum() > 0 else mix


def target_shares(counts: Sequence[int] | np.ndarray, alpha: float) -> np.ndarray:
    """Each group's share of the balanced stream: count ** alpha, normalised; 0 for a group without clips."""
    counts = np.asarray(counts, np.float64)
    weights = np.where(counts > 0, np.power(np.maximum(counts, 1.0), alpha), 0.0)
    return weights / weights.sum()


def accept_probs(counts: Sequence[int] | np.ndarray, alpha: float) -> np.ndarray | None:
    """Probability of keeping a record of each group: target share / corpus share, the largest 1.
    None when every group with clips would be kept always (alpha 1, one group): nothing to filter."""
    counts = np.asarray(counts, np.float64)
    if counts.sum() <= 0:
        return None
    corpus = counts / counts.sum()
    ratio = np.divide(target_shares(counts, alpha), corpus, out=np.zeros_like(corpus), where=corpus > 0)
    accept = ratio / ratio.max()
    return None if np.allclose(accept[counts > 0], 1.0) else accept


def reads_per_kept(counts: Sequence[int] | np.ndarray, accept: np.ndarray | None) -> float:
    """Records read per record kept: 1 / sum_g corpus_g * accept_g (= max_g target_g / corpus_g)."""
    if accept is None:
        return 1.0
    counts = np.asarray(counts, np.float64)
    return float(counts.sum() / (counts * accept).sum())


def describe(schema: Schema, balance: str, alpha: float, drawn: Sequence[float] | None = None) -> str:
    """One log line: each group's training share, its target share and the share the buckets as drawn
    give (`drawn`: records each bucket supplies, after the filter; None: in proportion to what each
    keeps), and the reading it costs."""
    counts = group_counts(schema, balance)
    names = [x.name if balance == "speaker" else x.code for x in _table(schema, balance)]
    shares = target_shares(counts, alpha)
    accept = accept_probs(counts, alpha)
    per_bucket = bucket_counts(schema, balance)
    total = max(sum(counts), 1)
    if per_bucket is None:
        shown = ", ".join(f"{n} {c / total:.1%} -> {s:.1%}" for n, c, s in list(zip(names, counts, shares))[:6])
    else:
        if drawn is None:
            drawn = per_bucket.sum(axis=1) * kept_fractions(per_bucket, accept)
        got = realised_shares(per_bucket, accept, drawn)
        shown = ", ".join(
            f"{n} {c / total:.1%} -> {s:.1%} (drawn {r:.1%})"
            for n, c, s, r in list(zip(names, counts, shares, got))[:6]
        )
    more = f", ... ({len(names)} {balance}s)" if len(names) > 6 else ""
    old = (
        (
            "; schema.json (before 3.2) has no per-bucket counts: the buckets are drawn by their records, so "
            "the shares hold only where the groups are spread alike over the length buckets (re-run `melshards "
            "preprocess` for exact shares)"
        )
        if per_bucket is None and len(schema.buckets) > 1
        else ""
    )
    return (
        f"data.balance {balance}, alpha {alpha:g} (training shares -> target): {shown}{more}; reads "
        f"{reads_per_kept(counts, accept):.2f} records per record trained on{old}"
    )


@dataclasses.dataclass(frozen=True)
class Balancing:
    """What the input pipeline needs to balance: the record feature holding the group id, and the
    probability of keeping a record of each group (indexed by that id); `bucket_kept`: the share of
    each bucket's records kept, which the buckets are drawn in proportion to (None: schema.json before
    3.2, the buckets are drawn by their records)."""

    feature: str
    accept: tuple[float, ...]
    bucket_kept: tuple[float, ...] | None = None


def balancing(schema: Schema, balance: str, alpha: float) -> Balancing | None:
    """The balancing of `data.balance` and `data.balance_alpha` over this schema; None: nothing to drop."""
    if balance == "none":
        return None
    accept = accept_probs(group_counts(schema, balance), alpha)
    if accept is None:
        return None
    per_bucket = bucket_counts(schema, balance)
    kept = None if per_bucket is None else tuple(float(k) for k in kept_fractions(per_bucket, accept))
    return Balancing(GROUP_FEATURE[balance], tuple(float(a) for a in accept), kept)


def bucket_weights(records: dict[int, float], balancing: Balancing | None) -> dict[int, float]:
    """{bucket index: records} -> the records each bucket gives a balanced stream: its records times
    the share it keeps (its records when nothing is dropped or schema.json does not say)."""
    if balancing is None or balancing.bucket_kept is None:
        return {i: float(n) for i, n in records.items()}
    return {i: float(n) * balancing.bucket_kept[i] for i, n in records.items()}


def sampler(balancing: Balancing, seed: int, deterministic: bool):
    """A tf.data transform of serialized records keeping each with probability accept[its group]."""
    from melshards.train.tf_quiet import tf

    table = tf.constant(balancing.accept, tf.float64)
    feature = balancing.feature
    spec = {feature: tf.io.FixedLenFeature([], tf.int64)}

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: nothing to convert
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
