"""Corpus statistics and the rules that use them: length histograms and cut-offs, the corpus tables and the
split, feature and quality statistics, the quality rules and their Beam transforms (`quality_stage`), the
filter's one rule (`filter_rule`), and the length buckets."""
