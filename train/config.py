"""Typed trainer config: every default lives here, YAML files override them (unknown keys are errors).

Sections: `data` (input pipeline), `model` (the text-to-mel network: `factory`, the
`package.module:factory` that builds it, and that factory's options), `optim` (AdamW + schedule),
`loop` (steps, checkpoints, logging, validation, precision). The command line may override
`loop.steps`, `loop.precision`, `loop.strategy`, `data.batch_size` and `model.factory`; nothing else invents a value.

The `model` section is free-form here: it belongs to the factory (train/contract.py). The built-in
model's factory reads it into `ModelConfig`, strictly (unknown keys are errors).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from melshards.shards_schema import Schema
from melshards.shards_schema.config import ConfigError, check, from_dict, load_yaml, one_of
from melshards.train.contract import BUILTIN_FACTORY, current_factory

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
BALANCES = ("none", "speaker", "language")  # train/balance.py samples them
STRATEGIES = ("auto", "one", "mirrored", "multiworker", "tpu")  # train/distribute.py builds them
AtLeast1 = Annotated[StrictInt, Field(ge=1)]  # bounds live on the fields; pydantic checks them (check)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    batch_size: AtLeast1 = 8  # of the longest length bucket; shorter buckets get larger ones (train/buckets.py)
    fixed_batch_size: StrictBool = False  # true: batch_size in every bucket
    shuffle_buffer: AtLeast1 = 64  # records (serialized); the iterator checkpoint holds this buffer
    cycle_length: AtLeast1 = 4  # shards read at once by interleave
    prefetch: AtLeast1 = 2  # batches (of steps_per_execution steps each) parsed ahead; the checkpoint holds them
    seed: StrictInt = 0
    deterministic: StrictBool = True  # fixed element order for a fixed seed, also across a resume
    balance: Annotated[StrictStr, one_of(*BALANCES)] = "none"  # none | speaker | language (train/balance.py)
    # a group's share of the records trained on is proportional to its clips ** alpha: 1 the corpus as it
    # is, 0 every group equally often
    balance_alpha: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] = 0.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The built-in Transformer-TTS (`melshards.train.model:build`)."""

    d_model: AtLeast1 = 128
    # speaker and language embeddings (tables of schema.json's speakers and languages), projected onto the
    # encoder output; 0 turns one off
    speaker_dim: Annotated[StrictInt, Field(ge=0)] = 32
    language_dim: Annotated[StrictInt, Field(ge=0)] = 16
    num_heads: AtLeast1 = 2
    ff_dim: StrictInt = 256
    encoder_layers: StrictInt = 2
    decoder_layers: StrictInt = 2
    encoder_conv_layers: StrictInt = 2  # conv prenet over character embeddings
    conv_kernel: StrictInt = 5
    prenet_dim: StrictInt = 128  # decoder prenet (dropout kept on: the Tacotron bottleneck)
    prenet_dropout: StrictFloat = 0.5
    postnet_channels: StrictInt = 128
    postnet_layers: StrictInt = 3
    reduction_factor: AtLeast1 = 4  # mel frames predicted per decoder step
    dropout: StrictFloat = 0.1
    stop_loss_weight: StrictFloat = 1.0

    def validate(self, schema: Schema) -> ModelConfig:
        check(self, "model options", prefix="model.")
        if self.d_model % self.num_heads:
            raise ConfigError(f"model.d_model {self.d_model} is not divisible by model.num_heads {self.num_heads}")
        for key, table in (("speaker_dim", schema.speakers), ("language_dim", schema.languages)):
            if getattr(self, key) and not table:
                raise ConfigError(
                    f"model.{key} is {getattr(self, key)} but schema.json lists no "
                    f"{key.split('_')[0]}s; set model.{key}: 0, or re-run `melshards preprocess`"
                )
        for b in schema.buckets:  # every bucket's shape is run through the decoder, r frames a step
            if b.max_mel_frames % self.reduction_factor:
                raise ConfigError(
                    f"the shards' max_mel_frames {b.max_mel_frames} (bucket {b.index}) is not divisible by "
                    f"model.reduction_factor {self.reduction_factor}; pick a factor of it (the shards are "
                    f"padded to a multiple of {schema.pad_multiple})"
                )
        return self


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: StrictFloat = 1e-3
    warmup_steps: StrictInt = 200  # linear warmup, then inverse square root decay
    weight_decay: StrictFloat = 1e-6
    beta_1: StrictFloat = 0.9
    beta_2: StrictFloat = 0.98
    clip_norm: StrictFloat = 1.0


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    steps: AtLeast1 = 1000  # total optimizer steps; a resumed run continues up to this number
    steps_per_execution: AtLeast1 = 1  # steps run inside one compiled call (Python dispatch once per K)
    checkpoint_every: AtLeast1 = 100
    keep_checkpoints: AtLeast1 = 3
    log_every: AtLeast1 = 10
    val_every: AtLeast1 = 100
    val_batches: StrictInt = 0  # 0: the whole --val set each time
    precision: Annotated[StrictStr, one_of(*PRECISIONS)] = (
        "float32"  # float32 | mixed_bfloat16 | mixed_float16 (with loss scaling)
    )
    strategy: Annotated[StrictStr, one_of(*STRATEGIES)] = (
        "auto"  # auto | one | mirrored | multiworker | tpu; data.batch_size is the global batch
    )
    seed: StrictInt = 0  # weights and dropout
    op_determinism: StrictBool = False  # tf.config.experimental.enable_op_determinism (slower)
    # false: the steps run on TensorFlow's own kernels instead of XLA (to compare, or where XLA fails); every
    # shape is still traced once
    jit_compile: StrictBool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: DataConfig = DataConfig()
    model: dict = dataclasses.field(default_factory=dict)  # {"factory": "pkg.mod:fn", **its options}
    optim: OptimConfig = OptimConfig()
    loop: LoopConfig = LoopConfig()

    @property
    def model_factory(self) -> str:
        return current_factory(self.model.get("factory", BUILTIN_FACTORY))

    @property
    def model_options(self) -> dict:
        """The model section as the factory receives it (without `factory`)."""
        return {k: v for k, v in self.model.items() if k != "factory"}

    def override(
        self,
        steps: int | None = None,
        batch_size: int | None = None,
        precision: str | None = None,
        strategy: str | None = None,
        model_factory: str | None = None,
    ) -> TrainConfig:
        cfg = self
        if model_factory is not None:
            cfg = dataclasses.replace(cfg, model=dict(cfg.model, factory=model_factory))
        loop: dict[str, Any] = {
            k: v for k, v in {"steps": steps, "precision": precision, "strategy": strategy}.items() if v is not None
        }
        if loop:
            cfg = dataclasses.replace(cfg, loop=dataclasses.replace(cfg.loop, **loop))
        if batch_size is not None:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch_size))
        return cfg

    def validate(self, schema: Schema) -> TrainConfig:
        """Everything that would otherwise fail (or silently misbehave) after compilation."""
        check(self, "train config")  # types and the bounds declared on the fields
        lp = self.loop
        k = lp.steps_per_execution
        for key, value in {
            "loop.steps": lp.steps,
            "loop.checkpoint_every": lp.checkpoint_every,
            "loop.log_every": lp.log_every,
            "loop.val_every": lp.val_every,
        }.items():
            if value % k:
                raise ConfigError(
                    f"{key} {value} is not a multiple of loop.steps_per_execution {k}: the compiled "
                    f"call runs {k} steps at a time. Use a multiple of {k}, or lower steps_per_execution"
                )
        if not isinstance(self.model.get("factory", BUILTIN_FACTORY), str):
            raise ConfigError(f"model.factory is {self.model['factory']!r}; give it as package.module:factory")
        from melshards.train.plugins import validate_options  # the factory's own checks of its options

        validate_options(self.model_factory, schema, self.model_options)
        return self


def load_config(path: str | Path | None) -> TrainConfig:
    return TrainConfig() if path is None else load_yaml(TrainConfig, path)


def config_from_dict(data: dict) -> TrainConfig:
    return from_dict(TrainConfig, data)
