"""melshards: log-mel TFRecord shards for TTS training (preprocess) and a static-shape XLA trainer (train).

The public Python API (docs/api.md): `dataset`, `bucket_datasets`, `audio_segments`, `read_schema`,
`normalizer` (melshards/api.py). They are loaded on first use, so `import melshards` does not import TensorFlow.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["audio_segments", "bucket_datasets", "dataset", "normalizer", "read_schema"]


def __getattr__(name: str):
    if name in __all__:
        from melshards import api

        return getattr(api, name)
    raise AttributeError(f"module 'melshards' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
