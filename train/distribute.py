"""tf.distribute for the trainer: the strategy, each worker's input, its model dir and preemption.

What compiles where (TF 2.21; see docs/train.md): a `jit_compile=True` function that calls
`strategy.run` fails under MirroredStrategy on several devices, and so does one that contains
`optimizer.apply` (`merge_call` while defining a graph). So under a strategy only each replica's
forward and backward pass is XLA-compiled (train/step.py); the all-reduces and `optimizer.apply`
run around it in an ordinary tf.function. On one device (`one`, the default strategy) the whole
step, optimizer included, stays one XLA cluster.

What checkpoints where: the iterators of distributed datasets are not trackable in TF 2.21
(`tf.train.Checkpoint(iterator=...)` raises), so under `mirrored`/`multiworker`/`tpu` a checkpoint
holds the weights, optimizer and step but not the input position; a resumed run reshuffles with a
seed derived from the step it resumes at (`resume_seed`) instead of replaying the first batches.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence

from melshards.shards_schema.config import ConfigError
from melshards.train.tf_quiet import tf

log = logging.getLogger("melshards.train")


def set_cpu_devices(n: int) -> None:
    """Split the first CPU into n logical devices (for `mirrored` without GPUs); before TF uses a device."""
    if n < 1:
        raise ConfigError(f"--cpu-devices is {n}; it must be at least 1")
    if n == 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError as e:  # devices already initialised in this process
        raise ConfigError(
            f"--cpu-devices {n}: TensorFlow's devices are already set up in this process ({e}); "
            "pass it on a fresh `melshards train` process"
        ) from e


@dataclasses.dataclass
class Topology:
    """The strategy and where this process sits in it. strategy None: the default (one device)."""

    name: str
    strategy: tf.distribute.Strategy | None
    replicas: int = 1
    workers: int = 1
    task_id: int = 0
    chief: bool = True
    resolver: object = None

    @property
    def local_replicas(self) -> int:
        return self.replicas // self.workers

    @property
    def distributed(self) -> bool:
        return self.strategy is not None

    def scope(self):
        return (self.strategy or tf.distribute.get_strategy()).scope()

    def per_replica_batch(self, global_batch: int) -> int:
        """data.batch_size is global; it must divide by the replicas (checked before anything compiles)."""
        if global_batch % self.replicas:
            raise ConfigError(
                f"data.batch_size {global_batch} is the global batch and does not divide by the "
                f"{self.replicas} replicas of --strategy {self.name}; use a multiple of {self.replicas}"
            )
        return global_batch // self.replicas

    def facts(self, global_batch: int) -> dict:
        return {
            "strategy": self.name,
            "replicas": self.replicas,
            "workers": self.workers,
            "local_replicas": self.local_replicas,
            "global_batch_size": global_batch,
            "per_replica_batch_size": global_batch // self.replicas,
        }


def _gpus() -> list[str]:
    return [d.name for d in tf.config.list_logical_devices("GPU")]


def make_topology(name: str) -> Topology:
    """The strategy for loop.strategy / --strategy. auto: mirrored over the GPUs when there are several."""
    if name == "auto":
        name = "mirrored" if len(_gpus()) > 1 else "one"
    if name == "one":
        return Topology("one", None)
    if name == "mirrored":
        devices = _gpus() or [d.name for d in tf.config.list_logical_devices("CPU")]
        strategy = tf.distribute.MirroredStrategy(devices)
        return Topology(name, strategy, replicas=strategy.num_replicas_in_sync)
    if name == "multiworker":
        tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        if not tf_config.get("cluster") or not tf_config.get("task"):
            raise ConfigError(
                "--strategy multiworker needs TF_CONFIG with a cluster and this process's task, e.g. "
                '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
                '"task": {"type": "worker", "index": 0}}'
            )
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict()
        task_type, task_id = resolver.task_type, int(resolver.task_id)
        chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and "chief" not in spec)
        workers = sum(len(spec.get(job, [])) for job in ("chief", "worker"))
        return Topology(
            name,
            strategy,
            replicas=strategy.num_replicas_in_sync,
            workers=workers,
            task_id=task_id,
            chief=chief,
            resolver=resolver,
        )
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        return Topology(
            name,
            strategy,
            replicas=strategy.num_replicas_in_sync,
            workers=max(1, len(resolver.cluster_spec().as_dict().get("worker", []))),
            resolver=resolver,
        )
    raise ConfigError(f"unknown strategy {name!r}")


def write_dir(model_dir: str, topo: Topology) -> str:
    """Where this worker writes: the model dir on the chief, a temp dir on the others (the MWMS pattern).

    Every worker takes part in saving (variables may be read collectively), but only the chief's
    files are the run's.
    """
    if topo.chief:
        return model_dir
    return tempfile.mkdtemp(prefix=f"melshards-worker{topo.task_id}-")


def remove_write_dir(path: str, model_dir: str) -> None:
    if path != model_dir:
        shutil.rmtree(path, ignore_errors=True)


def shard_plan(files: int, pipelines: int) -> str:
    """How the input pipelines split the data: by whole files when each gets one, else by record."""
    return "files" if files >= pipelines else "records"


def resume_seed(seed: int, step: int) -> int:
    """The shuffle seed of an input pipeline started at `step` without its saved position.

    A distinct seed per start step: the resumed run draws a new order instead of replaying the
    batches the run began with. Step 0 keeps the configured seed.
    """
    return seed if step == 0 else (seed * 1_000_003 + step) % (2**31 - 1)


def distributed_dataset(
    topo: Topology, make: Callable[..., tf.data.Dataset], files: Sequence[str], global_batch: int, specs: dict
):
    """strategy.distribute_datasets_from_function over `make(batch_size=, shard=)`, per replica.

    `specs`: the per-replica {name: TensorSpec [K, b, ...]}; tf.ensure_shape gives the batch
    its static shape back.
    """

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        b = ctx.get_per_replica_batch_size(global_batch)
        n, i = ctx.num_input_pipelines, ctx.input_pipeline_id
        shard = None
        if n > 1:
            how = shard_plan(len(files), n)
            log.info(
                "input pipeline %d of %d reads %s",
                i,
                n,
                f"{len(files[i::n])} of {len(files)} shard files"
                if how == "files"
                else f"one record in {n} of all {len(files)} shard files (fewer files than workers)",
            )
            shard = (how, n, i)
        ds = make(batch_size=b, shard=shard)
        return ds.map(lambda batch: {k: tf.ensure_shape(v, specs[k].shape) for k, v in batch.items()})

    return topo.strategy.distribute_datasets_from_function(dataset_fn)  # type: ignore[union-attr]  # called only under a strategy


class Preempted(Exception):
    """Raised after the preemption checkpoint: the loop ends the run cleanly."""


class Preemption:
    """tf.distribute.experimental.PreemptionCheckpointHandler for `multiworker`.

    SIGTERM on any worker: all workers agree on a step, checkpoint at it (through `save`, so the
    checkpoint is laid out like every other one), and leave through `Preempted`. The handler reads
    its run counter from the chief's checkpoint dir on every worker, so restarted workers agree.
    """

    def __init__(
        self, topo: Topology, checkpoint: tf.train.Checkpoint, chief_checkpoint_dir: str, save: Callable[[int], str]
    ):
        def leave():
            raise Preempted()

        self.step = 0
        read = tf.train.CheckpointManager(checkpoint, chief_checkpoint_dir, max_to_keep=None)
        config = tf.distribute.experimental.TerminationConfig(
            exit_fn=leave, save_fn=lambda: save(self.step), grace_period=0
        )
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            topo.resolver, read, termination_config=config
        )

    def check(self, step: int) -> None:
        """After every call of the step, on every worker."""
        self.step = step
        self.handler.save_checkpoint_if_preempted()
