from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stages.core.hashing import sha256_file
from stages.evaluation.video import tile, write_gif


def test_tile_puts_worlds_side_by_side() -> None:
    frames = np.stack([np.full((4, 3, 3), i, np.uint8) for i in range(2)])
    out = tile(frames)
    assert out.shape == (4, 6, 3)
    assert (out[:, :3] == 0).all() and (out[:, 3:] == 1).all()


def test_gif_has_every_frame_and_is_reproducible(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (24, 32, 3), dtype=np.uint8) for _ in range(5)]
    write_gif(frames, tmp_path / "a.gif", fps=12.5)
    write_gif(frames, tmp_path / "b.gif", fps=12.5)
    assert sha256_file(tmp_path / "a.gif") == sha256_file(tmp_path / "b.gif")
    with Image.open(tmp_path / "a.gif") as im:
        assert im.n_frames == 5 and im.size == (32, 24)
        assert im.info["duration"] == 80


def test_no_frames_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_gif([], tmp_path / "x.gif", fps=10)
