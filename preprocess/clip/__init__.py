"""Measuring a clip: decoding and the log-mel, the per-frame features, alignments, quality measures and
extractors, the feature cache, and the measure stage that runs them on each batch."""
