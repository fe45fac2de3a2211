"""ZeRO (stages 1, 2 and 3) and DDP (stage 0) for custom training loops: the
public face of ``ringcomm.train.zero_optimizer`` (numpy units) and
``ringcomm.torch.torch_zero`` (torch modules).

    zero = ringcomm.zero.ZeroOptimizer(units, comm, stage=3, lr=1e-3)   # numpy
    zero = ringcomm.zero.TorchZero(model, comm, stage=3, lr=1e-3)       # torch

``TorchZero`` imports torch when it is first asked for, so importing this
module never does.
"""

from .train.zero_optimizer import ZeroOptimizer, consolidate, expected_memory, expected_traffic

__all__ = ["ZeroOptimizer", "consolidate", "expected_memory", "expected_traffic"]  # and TorchZero, on demand (not in __all__: a star import must not import torch)


def __getattr__(name):
    if name == "TorchZero":
        from .torch.torch_zero import TorchZero
        return TorchZero
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
