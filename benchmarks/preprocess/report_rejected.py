"""The report stage's memory for rejected.jsonl with many rejected rows: all of them held and sorted in
one worker (the report's design before), against the sorted shards and their merge (`report.WriteRejected`,
`report.write_merged`).

Python heap peaks (tracemalloc), each variant from an empty heap:
  held     the rows as the report's side input held them (a list of N dicts), sorted, and the file's
           text joined in memory, as `rejected_lines` did
  shard    the largest shard's writer: its group of rows (at most about ROWS_PER_REJECTED_SHARD), sorted
           and written
  merge    the merge of every shard into rejected.jsonl, a line at a time
Rows are like a corpus' missing audio: {"id", "reason", "detail": the path}.

Run: python -m benchmarks.preprocess.report_rejected [--rows 1000000] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import tracemalloc
from collections import defaultdict
from pathlib import Path

from melshards.preprocess.out_dir.shards import TEMP_DIR
from melshards.preprocess.write import report


def rows(n: int):
    for i in range(n):
        yield {
            "id": f"r{(i * 7919) % n:07d}",
            "reason": "missing_audio",
            "detail": f"/data/corpus/wavs/r{(i * 7919) % n:07d}.wav does not exist",
        }


def peak(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def held(n: int, out: Path) -> None:
    rejected = list(rows(n))
    ordered = sorted(rejected, key=report.rejected_order)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in ordered)
    (out / "held.jsonl").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args()
    out = Path(args.work_dir or tempfile.mkdtemp(prefix="report-rejected-"))
    (out / TEMP_DIR).mkdir(parents=True, exist_ok=True)
    n = args.rows
    shards = report.rejected_shard_count(n)
    groups: dict[int, list[int]] = defaultdict(list)  # row numbers per shard (the grouping, outside the peaks)
    for i, row in enumerate(rows(n)):
        groups[report.rejected_shard_of(row, shards)].append(i)
    largest = max(groups, key=lambda k: len(groups[k]))
    paths = []

    def write_shards(only: int | None):
        all_rows = None
        for index, numbers in sorted(groups.items()):
            if only is not None and index != only:
                continue
            if all_rows is None:
                all_rows = list(rows(n)) if only is None else None
            wanted = set(numbers)
            group = (
                [all_rows[i] for i in numbers]
                if all_rows is not None
                else [r for i, r in enumerate(rows(n)) if i in wanted]
            )
            paths.extend(report._WriteRejectedShardFn(str(out)).process((index, group)))

    write_shards(None)  # every shard on disk, for the merge (not measured)
    paths.clear()
    results = {
        "rows": n,
        "shards": shards,
        "largest_shard_rows": len(groups[largest]),
        "held_mib": peak(lambda: held(n, out)) / 2**20,
        "shard_mib": peak(lambda: write_shards(largest)) / 2**20,
    }
    every = sorted(str(p) for p in (out / TEMP_DIR).glob("rejected-*.jsonl"))
    results["merge_mib"] = peak(lambda: report.write_merged(str(out), "rejected.jsonl", every)) / 2**20
    same = (out / "held.jsonl").read_bytes() == (out / "rejected.jsonl").read_bytes()
    print(json.dumps(dict(results, same_file=same), indent=1))


if __name__ == "__main__":
    main()
