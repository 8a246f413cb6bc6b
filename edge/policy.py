"""Running a torch policy module for inference: eval mode, no autograd, its device."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def module_device(module: torch.nn.Module) -> torch.device:
    """Device of the module's first parameter or buffer; CPU for a module holding neither."""
    import torch

    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


@contextlib.contextmanager
def inference(module: torch.nn.Module) -> Iterator[torch.device]:
    """Put ``module`` in eval mode without autograd and yield its device.

    Every submodule's training flag is restored on exit, so the caller's module is left
    exactly as it was given.
    """
    import torch

    flags = [(sub, sub.training) for sub in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield module_device(module)
    finally:
        for sub, training in flags:
            sub.training = training
