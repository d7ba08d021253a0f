"""`melshards train`: check the invocation, then train (`melshards.train.loop`).

Every check that can fail (globs, schemas, config, batch and step arithmetic) runs before the model
is built or anything is compiled, so a bad call fails at once with a message.
"""

from __future__ import annotations

import logging

import click

from melshards.commands import run_command, setup_logging
from melshards.shards_schema import SchemaError
from melshards.shards_schema.config import ConfigError


def run(argv: list[str] | None = None) -> int:
    """Entry point for tests; returns the process exit code."""
    return run_command(train_command, argv, "melshards train")


@click.command("train", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("shard_globs", nargs=-1, required=True)
@click.option(
    "--model-dir",
    required=True,
    help="Checkpoints, TensorBoard logs and run_summary.json; local or gs://. "
    "Training resumes from the newest checkpoint here.",
)
@click.option("--val", "val_globs", multiple=True, help="Validation shard glob (repeatable).")
@click.option("--config", "config_path", default=None, help="YAML config, e.g. configs/train_tiny.yaml.")
@click.option("--steps", type=int, default=None, help="Total steps to reach (overrides loop.steps).")
@click.option("--batch-size", type=int, default=None, help="Overrides data.batch_size.")
@click.option(
    "--schema",
    "schema_path",
    default=None,
    help="Reference schema.json every shard directory must agree with, and the schema of shards "
    "without one beside them (default: the one beside the first shard).",
)
@click.option(
    "--model",
    "model_factory",
    default=None,
    metavar="PACKAGE.MODULE:FACTORY",
    help="Model factory (train/contract.py), e.g. examples.fastspeech_lite:build; overrides "
    "model.factory (default: the built-in Transformer-TTS, melshards.train.model:build).",
)
@click.option(
    "--synthetic-data",
    is_flag=True,
    help="Feed one constant batch from memory: the input-free upper bound on throughput.",
)
@click.option(
    "--strategy",
    type=click.Choice(["auto", "one", "mirrored", "multiworker", "tpu"]),
    default=None,
    help="tf.distribute strategy (overrides loop.strategy): auto is mirrored over several GPUs, else one "
    "device; multiworker reads TF_CONFIG; tpu uses TPU_NAME (default: local). --batch-size is global.",
)
@click.option(
    "--cpu-devices",
    type=int,
    default=1,
    show_default=True,
    help="Split the CPU into N logical devices, e.g. to try --strategy mirrored without GPUs.",
)
@click.option(
    "--precision",
    type=click.Choice(["float32", "mixed_bfloat16", "mixed_float16"]),
    default=None,
    help="Overrides loop.precision (mixed_float16 trains with loss scaling).",
)
def train_command(
    shard_globs,
    model_dir,
    val_globs,
    config_path,
    steps,
    batch_size,
    schema_path,
    model_factory,
    synthetic_data,
    strategy,
    cpu_devices,
    precision,
) -> None:
    """Train a text-to-mel model on SHARD_GLOB... (local or gs://) written by `melshards preprocess`."""
    setup_logging()
    from melshards.train.xla_cache import enable_persistent_cache  # imports no TensorFlow

    xla_cache = enable_persistent_cache()  # the group did it before importing TensorFlow; this for run()
    from melshards.train import distribute
    from melshards.train.config import load_config
    from melshards.train.errors import ModelDirError, RestoreError, TrainError
    from melshards.train.input_pipeline import InputError
    from melshards.train.loop import resolve_inputs, train
    from melshards.train.metrics import format_summary
    from melshards.train.model_dir import check_model_dir_target

    try:
        distribute.set_cpu_devices(cpu_devices)  # before anything sets up TensorFlow's devices
        cfg = load_config(config_path).override(
            steps=steps, batch_size=batch_size, precision=precision, strategy=strategy, model_factory=model_factory
        )
        inputs = resolve_inputs(shard_globs, val_globs, schema_path, cfg)
        check_model_dir_target(model_dir, inputs)  # never among the shards, a run, or files it did not write
        topo = distribute.make_topology(inputs.cfg.loop.strategy)
        topo.per_replica_batch(inputs.cfg.data.batch_size)
    except (ConfigError, SchemaError, InputError, ModelDirError) as e:
        raise click.UsageError(str(e)) from e
    if xla_cache:
        logging.getLogger("melshards.train").info("compiled steps are kept in %s (MELSHARDS_XLA_CACHE)", xla_cache)
    try:
        summary = train(inputs, model_dir, synthetic=synthetic_data, topo=topo)
    except (ModelDirError, ConfigError) as e:  # ConfigError: the model factory or its model (PluginError)
        raise click.UsageError(str(e)) from e
    except (TrainError, RestoreError, SchemaError) as e:
        raise click.ClickException(str(e)) from e
    click.echo("\nrun summary (" + f"{model_dir}/run_summary.json" + ")\n" + format_summary(summary))
