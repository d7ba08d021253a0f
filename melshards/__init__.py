"""melshards: log-mel TFRecord shards for TTS training (preprocess) and a static-shape XLA trainer (train)."""
__version__ = "0.1.0"
