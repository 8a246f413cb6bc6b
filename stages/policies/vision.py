"""Policies that see: a small convolutional image encoder per camera whose spatial softmax gives
keypoints, joined with the normalized state, and the random-shift augmentation they train with.

The network reads its named inputs positionally, in the order of its ``inputs`` attribute:
``obs`` (batch, obs_dim) float32 first, then each camera image (batch, H, W, 3) uint8 RGB HWC
(:mod:`stages.sim.env.cameras`). Everything a deployed policy needs happens inside it: the state
is normalized with the training split's mean and std, each image is scaled by 1/255 and laid
out NCHW, so its ONNX export takes the raw tensors.

Each encoder is sized for a CPU: an 8 x 8 convolution of stride 4 (a 64 x 64 frame becomes
16 x 16), then 3 x 3 convolutions of stride 1, ELU between them, and a spatial softmax
(robomimic's: the expected image position of each channel of the last convolution, with a
learned temperature) that turns the last feature map into 2 keypoint coordinates per channel
in [-1, 1]. Keypoints and state feed an ELU MLP with a tanh output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from stages.sim.env.observation import STATE_KEY

ImageShape = tuple[int, int, int]
"""One world's image: (height, width, channels)."""

KIND = "vision"
"""The ``kind`` entry of a vision policy's npz metadata (:mod:`stages.policies.local`)."""

_FIRST = (8, 4, 2)
"""Kernel size, stride and padding of each encoder's first convolution."""

_REST = (3, 1, 1)
"""Kernel size, stride and padding of each later convolution."""


def elu_mlp(width: int, hidden: Sequence[int], out: int, tanh: bool) -> nn.Sequential:
    """Linear layers ``width -> *hidden -> out`` with ELU between them and, if ``tanh``, a tanh
    on the output. Shape: (batch, width) -> (batch, out)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ELU()]
        width = h
    layers.append(nn.Linear(width, out))
    if tanh:
        layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class SpatialSoftmax(nn.Module):
    """The expected image position of each channel's activation, under a softmax over its pixels
    at a learned temperature. Shape: (batch, C, H, W) -> (batch, 2 C): channel 0's x and y,
    channel 1's, and so on, each in [-1, 1] (left/top -1, right/bottom 1)."""

    grid: torch.Tensor

    def __init__(self, height: int, width: int) -> None:
        """Fix the pixel grid of a (height, width) feature map."""
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1.0, 1.0, height),
                                torch.linspace(-1.0, 1.0, width), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1),
                             persistent=False)
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Keypoints of ``features``. Shape: (batch, C, H, W) -> (batch, 2 C)."""
        weights = torch.softmax(features.flatten(2) / self.temperature, dim=-1)
        return (weights @ self.grid).flatten(1)


def _conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output size of a convolution along one axis of ``size`` pixels."""
    return (size + 2 * pad - kernel) // stride + 1


def image_shape(shape: Sequence[int]) -> ImageShape:
    """``shape`` as an (H, W, 3) tuple of ints; ValueError for any other shape."""
    dims = tuple(int(d) for d in shape)
    if len(dims) != 3 or dims[2] != 3 or min(dims) < 1:
        raise ValueError(f"a camera image must be (H, W, 3), got {dims}")
    return dims[0], dims[1], dims[2]


class ImageEncoder(nn.Module):
    """One camera's encoder: uint8 HWC frames to keypoints (module doc).
    Shape: (batch, H, W, 3) uint8 -> (batch, 2 * channels[-1]) float32."""

    def __init__(self, shape: ImageShape, channels: Sequence[int]) -> None:
        """Build the convolutions for frames of ``shape`` (H, W, 3), one per ``channels`` entry.

        Raises ValueError when ``shape`` is not (H, W, 3) or too small for the first
        convolution.
        """
        super().__init__()
        height, width, depth = image_shape(shape)
        if min(height, width) < _FIRST[0] - 2 * _FIRST[2]:
            raise ValueError(f"an image encoder needs frames of at least "
                             f"{_FIRST[0] - 2 * _FIRST[2]} pixels a side, got {tuple(shape)}")
        layers: list[nn.Module] = []
        for i, out in enumerate(channels):
            kernel, stride, pad = _FIRST if i == 0 else _REST
            if i:
                layers.append(nn.ELU())
            layers.append(nn.Conv2d(depth, out, kernel, stride, pad))
            height, width = (_conv_out(n, kernel, stride, pad) for n in (height, width))
            depth = out
        self.conv = nn.Sequential(*layers)
        self.keypoints = SpatialSoftmax(height, width)
        self.out_dim = 2 * depth

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Keypoints of ``image``. Shape: (batch, H, W, 3) uint8 -> (batch, out_dim)."""
        pixels = image.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        out: torch.Tensor = self.keypoints(self.conv(pixels))
        return out


class VisionPolicy(nn.Module):
    """State and camera images to actions in [-1, 1] (module doc).

    Shape: forward(obs (batch, obs_dim) float32, *images (batch, H, W, 3) uint8, in the order
    of :attr:`inputs`) -> actions (batch, act_dim) float32.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int],
        cameras: Sequence[tuple[str, ImageShape]],
        mean: np.ndarray,
        std: np.ndarray,
        encoder_channels: Sequence[int] = (16, 32),
    ) -> None:
        """A policy reading the state and ``cameras`` (each an image tensor name and its
        (H, W, 3) shape, in input order), normalizing the state with ``mean`` and ``std``
        (obs_dim,).

        ``encoder_channels`` are each image encoder's convolution widths; ``hidden`` the MLP's.
        Raises ValueError for no camera or an image too small for the encoder.
        """
        super().__init__()
        if not cameras:
            raise ValueError("a vision policy needs at least one camera image")
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.hidden = tuple(int(h) for h in hidden)
        self.cameras = tuple((str(key), image_shape(shape)) for key, shape in cameras)
        self.encoder_channels = tuple(int(c) for c in encoder_channels)
        self.inputs: tuple[str, ...] = (STATE_KEY, *(key for key, _ in self.cameras))
        self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float32))
        encoders = {key: ImageEncoder(shape, self.encoder_channels) for key, shape in self.cameras}
        self.encoders = nn.ModuleDict(encoders)
        width = obs_dim + sum(enc.out_dim for enc in encoders.values())
        self.net = elu_mlp(width, self.hidden, act_dim, tanh=True)

    def forward(self, obs: torch.Tensor, *images: torch.Tensor) -> torch.Tensor:
        """Actions for a batch of observations (class doc)."""
        if len(images) != len(self.encoders):
            raise ValueError(f"the policy reads {self.inputs}, got {1 + len(images)} tensors")
        parts = [(obs - self.obs_mean) / self.obs_std]
        parts += [enc(image) for enc, image in zip(self.encoders.values(), images, strict=True)]
        out: torch.Tensor = self.net(torch.cat(parts, dim=1))
        return out


build_vision_policy = VisionPolicy
"""Build a policy that sees (:class:`VisionPolicy`'s constructor)."""


def vision_meta(module: VisionPolicy) -> dict[str, Any]:
    """What :func:`build_vision_policy` needs to build ``module`` again, as npz metadata:
    ``kind``, ``obs_dim``, ``act_dim``, ``hidden``, ``cameras`` ([{"key", "shape"}]) and
    ``encoder_channels``."""
    return {"kind": KIND, "obs_dim": module.obs_dim, "act_dim": module.act_dim,
            "hidden": list(module.hidden),
            "cameras": [{"key": key, "shape": list(shape)} for key, shape in module.cameras],
            "encoder_channels": list(module.encoder_channels)}


def vision_from_meta(meta: Mapping[str, Any], mean: np.ndarray, std: np.ndarray) -> VisionPolicy:
    """The untrained policy that ``meta`` (:func:`vision_meta`) describes.

    Raises KeyError, TypeError or ValueError for metadata that describes none.
    """
    cameras = [(str(cam["key"]), image_shape(cam["shape"])) for cam in meta["cameras"]]
    return build_vision_policy(int(meta["obs_dim"]), int(meta["act_dim"]),
                               tuple(int(h) for h in meta["hidden"]), cameras, mean, std,
                               tuple(int(c) for c in meta["encoder_channels"]))


def random_shift(images: torch.Tensor, shift: int, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
    """Each image moved by its own random offset of up to ``shift`` pixels along each axis,
    the edge pixels repeated into the gap (DrQ's pad-and-crop with replicate padding).

    Works on any dtype (uint8 frames stay uint8). ``shift`` 0 returns ``images`` itself.
    Shape: (batch, H, W, C) -> (batch, H, W, C).
    """
    if shift <= 0:
        return images
    batch, height, width = images.shape[:3]
    device = images.device
    offsets = torch.randint(-shift, shift + 1, (batch, 2), generator=generator).to(device)
    rows = (torch.arange(height, device=device) + offsets[:, :1]).clamp(0, height - 1)
    cols = (torch.arange(width, device=device) + offsets[:, 1:]).clamp(0, width - 1)
    index = torch.arange(batch, device=device)[:, None, None]
    return images[index, rows[:, :, None], cols[:, None, :]]
