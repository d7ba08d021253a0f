"""Typed trainer config: every default lives here, YAML files override them (unknown keys are errors).

Sections: `data` (input pipeline), `model` (text-to-mel network), `optim` (AdamW + schedule),
`loop` (steps, checkpoints, logging, validation, precision). The command line may override
`loop.steps` and `data.batch_size`; nothing else invents a value.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from shards_schema import Schema
from shards_schema.config import ConfigError, from_dict, load_yaml

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    batch_size: int = 8  # of the longest length bucket; shorter buckets get larger ones (train/buckets.py)
    fixed_batch_size: bool = False  # true: batch_size in every bucket
    shuffle_buffer: int = 64  # records (serialized); the iterator checkpoint holds this buffer
    cycle_length: int = 4  # shards read at once by interleave
    prefetch: int = 2  # batches (of steps_per_execution steps each) prepared ahead of the step
    seed: int = 0
    deterministic: bool = True  # fixed element order for a fixed seed, also across a resume


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    d_model: int = 128
    num_heads: int = 2
    ff_dim: int = 256
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_conv_layers: int = 2  # conv prenet over character embeddings
    conv_kernel: int = 5
    prenet_dim: int = 128  # decoder prenet (dropout kept on: the Tacotron bottleneck)
    prenet_dropout: float = 0.5
    postnet_channels: int = 128
    postnet_layers: int = 3
    reduction_factor: int = 4  # mel frames predicted per decoder step
    dropout: float = 0.1


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-3
    warmup_steps: int = 200  # linear warmup, then inverse square root decay
    weight_decay: float = 1e-6
    beta_1: float = 0.9
    beta_2: float = 0.98
    clip_norm: float = 1.0
    stop_loss_weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    steps: int = 1000  # total optimizer steps; a resumed run continues up to this number
    steps_per_execution: int = 1  # steps run inside one compiled call (Python dispatch once per K)
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    log_every: int = 10
    val_every: int = 100
    val_batches: int = 0  # 0: the whole --val set each time
    precision: str = "float32"  # float32 | mixed_bfloat16 | mixed_float16 (with loss scaling)
    seed: int = 0  # weights and dropout
    op_determinism: bool = False  # tf.config.experimental.enable_op_determinism (slower)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    loop: LoopConfig = LoopConfig()

    def override(self, steps: int | None = None, batch_size: int | None = None) -> "TrainConfig":
        cfg = self
        if steps is not None:
            cfg = dataclasses.replace(cfg, loop=dataclasses.replace(cfg.loop, steps=steps))
        if batch_size is not None:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch_size))
        return cfg

    def validate(self, schema: Schema) -> "TrainConfig":
        """Everything that would otherwise fail (or silently misbehave) after compilation."""
        d, m, lp = self.data, self.model, self.loop
        positive = {"data.batch_size": d.batch_size, "data.shuffle_buffer": d.shuffle_buffer,
                    "data.cycle_length": d.cycle_length, "data.prefetch": d.prefetch,
                    "model.d_model": m.d_model, "model.num_heads": m.num_heads,
                    "model.reduction_factor": m.reduction_factor, "loop.steps": lp.steps,
                    "loop.steps_per_execution": lp.steps_per_execution,
                    "loop.checkpoint_every": lp.checkpoint_every, "loop.log_every": lp.log_every,
                    "loop.val_every": lp.val_every, "loop.keep_checkpoints": lp.keep_checkpoints}
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} is {value}; it must be at least 1")
        if lp.precision not in PRECISIONS:
            raise ConfigError(f"loop.precision is {lp.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if m.d_model % m.num_heads:
            raise ConfigError(f"model.d_model {m.d_model} is not divisible by model.num_heads {m.num_heads}")
        for b in schema.buckets:  # every bucket's shape is run through the decoder, r frames a step
            if b.max_mel_frames % m.reduction_factor:
                raise ConfigError(
                    f"the shards' max_mel_frames {b.max_mel_frames} (bucket {b.index}) is not divisible by "
                    f"model.reduction_factor {m.reduction_factor}; pick a factor of it (the shards are "
                    f"padded to a multiple of {schema.pad_multiple})")
        k = lp.steps_per_execution
        for key, value in {"loop.steps": lp.steps, "loop.checkpoint_every": lp.checkpoint_every,
                           "loop.log_every": lp.log_every, "loop.val_every": lp.val_every}.items():
            if value % k:
                raise ConfigError(
                    f"{key} {value} is not a multiple of loop.steps_per_execution {k}: the compiled "
                    f"call runs {k} steps at a time. Use a multiple of {k}, or lower steps_per_execution")
        return self


def load_config(path: str | Path | None) -> TrainConfig:
    return TrainConfig() if path is None else load_yaml(TrainConfig, path)


def config_from_dict(data: dict) -> TrainConfig:
    return from_dict(TrainConfig, data)
