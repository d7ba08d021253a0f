"""Corpus statistics and the rules that use them: length histograms and cut-offs, the corpus tables and the
split, feature and quality statistics, the quality rules, and the length buckets."""
