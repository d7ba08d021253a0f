"""The training half: a static-shape, compiled-once text-to-mel trainer over melshards shards."""
