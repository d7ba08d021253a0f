"""What the step is compiled for, and the layer implementations chosen for it.

Two of the built-in layers have an implementation per device (docs/train.md, "Per-device choices"):

- `Conv1D`: on CPU, shifted copies + one matmul (im2col): XLA on CPU runs the gradient of the native
  convolution far slower than a matmul of the same FLOPs (docs/performance.md#train-step). On a
  GPU or TPU the native convolution: cuDNN and the TPU's convolution units run it directly, and
  im2col would multiply the activation memory of every conv by its kernel size.
- Dropout's random generator: on CPU threefry: XLA on CPU runs TF's default ("auto_select") far
  slower (docs/performance.md#train-step). On a GPU philox, the generator TensorFlow's own GPU
  kernels use; on a TPU "auto_select", which XLA maps to the TPU's hardware generator.

Both implementations of each keep the same variables, so a checkpoint trained on a GPU synthesizes on
a CPU (tests/train/test_device.py checks each pair gives the same results within tolerance).
"""

from __future__ import annotations

import contextlib
import dataclasses

from melshards.train.tf_quiet import tf

DEVICE_TYPES = ("CPU", "GPU", "TPU")


@dataclasses.dataclass(frozen=True)
class Choices:
    """The implementations the built-in layers use on one device type."""

    device: str  # CPU | GPU | TPU: what the step is compiled for
    conv: str  # im2col | native
    dropout_rng: str  # threefry | philox | auto_select (tf.random's alg names)

    def facts(self) -> dict:
        return {"device": self.device, "conv": self.conv, "dropout_rng": self.dropout_rng}


CHOICES = {
    "CPU": Choices("CPU", "im2col", "threefry"),
    "GPU": Choices("GPU", "native", "philox"),
    "TPU": Choices("TPU", "native", "auto_select"),
}

_current: list[Choices] = []


def step_device(strategy: tf.distribute.Strategy | None = None) -> str:
    """The device type the train step is compiled for: the strategy's replica devices, else where
    TensorFlow places ops by default (the first GPU when there is one)."""
    if strategy is not None:
        devices = strategy.extended.worker_devices
        kinds = {tf.DeviceSpec.from_string(d).device_type for d in devices}
        return next((k for k in ("TPU", "GPU") if k in kinds), "CPU")
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def choices_for(device: str, jit_compile: bool = True) -> Choices:
    """The device's choices; without XLA (loop.jit_compile false) dropout draws with philox, since TF's
    own threefry kernel refuses the [2] keys the step folds."""
    if device not in CHOICES:
        raise ValueError(f"device type {device!r}: one of {', '.join(DEVICE_TYPES)}")
    chosen = CHOICES[device]
    return (
        chosen if jit_compile or chosen.dropout_rng != "threefry" else dataclasses.replace(chosen, dropout_rng="philox")
    )


def current() -> Choices:
    """The choices of the device being built for (`building_for`); the running machine's by default."""
    return _current[-1] if _current else choices_for(step_device())


@contextlib.contextmanager
def building_for(choices: Choices):
    """Layers built inside take `choices` (train/plugins.py build_model wraps the factory in it)."""
    _current.append(choices)
    try:
        yield choices
    finally:
        _current.pop()
