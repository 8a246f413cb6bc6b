"""Rollout videos: frames recorded during validation, written as animated GIFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def tile(frames: np.ndarray) -> np.ndarray:
    """Place several worlds' frames side by side. Shape: (K, H, W, 3) -> (H, K * W, 3)."""
    k, h, w, c = frames.shape
    return frames.transpose(1, 0, 2, 3).reshape(h, k * w, c)


def write_gif(frames: list[np.ndarray], path: Path, fps: float) -> None:
    """Write RGB frames, each (H, W, 3) uint8, as a looping GIF; same frames, same bytes."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to write")
    images = [Image.fromarray(f).convert("P", palette=Image.Palette.ADAPTIVE, colors=128)
              for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:],
                   duration=max(20, round(1000 / fps)), loop=0, optimize=False)
