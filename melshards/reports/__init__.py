"""What the commands print about a run: the figures of stats.json and the analyses `melshards stats` adds.

- `stats_json_tables`: the tables of a run's stats.json as the job wrote it (percentiles, counts,
  padding, buckets) and the plain-text renderer; printed after `melshards preprocess` and by `melshards stats`.
- `whatif`: what another upper cut-off would cost, computed from the exact before-filter histograms.
- `quality_tables`: the quality measures' figures, the clips each quality rule dropped, and what other
  bounds would drop, from stats.json's exact histograms of the measures.
- `stats_report`: loads a finished run (stats.json, schema.json, rejected.jsonl) and gathers every figure
  `melshards stats` shows into one dict (its `--json` output).
- `stats_report_tables`: the tables only that report has: what-if cut-offs, rejection reasons with
  examples, two runs side by side.
- `by_tables`: `melshards stats --by speaker|language`: the speaker and language tables, and both per
  run side by side.
- `html_report`: `melshards stats --html`, one self-contained HTML file.
- `record_view`: `melshards inspect --show N`, one record as the trainer sees it, as text and a mel PNG.

Nothing here imports TensorFlow; the commands import these modules only when they run.
"""
