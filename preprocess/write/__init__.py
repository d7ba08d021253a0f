"""Writing the output: the filter, padding and encoding of each kept clip into records, the references,
and the reports (rejected.jsonl, stats.json, schema.json)."""
