"""Camera frames of LeRobot v3 datasets as MP4 videos, encoded and decoded with PyAV.

LeRobot 0.6 stores each camera ``observation.images.<camera>`` as MP4 files under
``videos/observation.images.<camera>/chunk-CCC/file-FFF.mp4``, episodes one after another in
a file, and finds an episode's frames by time: ``from_timestamp`` (in ``meta/episodes``) plus
the frame's ``timestamp`` (in the data). Its encoder's defaults (``lerobot.configs.video.
VideoEncoderConfig``) are AV1 by SVT-AV1 (``libsvtav1``), ``yuv420p``, a keyframe every 2
frames (``g``), ``crf`` 30, ``preset`` 12; written here with the same settings, its decoders
(torchcodec, or PyAV where torchcodec does not load) read them as they read their own.

AV1 at crf 30 in yuv420p is lossy: frames come back close to what was written, not equal (a
mean absolute difference of about 1 to 3 of 255 levels on 64x64 rendered scenes, more on
sharp edges, where colours are shared by 2x2 pixels). docs/datasets.md states the tolerance
the tests hold the round trip to.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from stages.errors import ConfigError

if TYPE_CHECKING:
    from av.video.stream import VideoStream

CODEC = "libsvtav1"
"""The encoder (SVT-AV1), as LeRobot's ``VideoEncoderConfig.vcodec`` defaults."""
PIX_FMT = "yuv420p"
GOP = 2
"""Keyframe interval, frames (LeRobot's ``g``): a seek decodes at most one frame more."""
CRF = 30
PRESET = 12
FAST_DECODE = 0


def encoder_info() -> dict[str, Any]:
    """The encoder's settings as LeRobot records them in a video feature's ``info``
    (``video.<field>`` of ``VideoEncoderConfig``)."""
    return {"video.g": GOP, "video.crf": CRF, "video.preset": PRESET,
            "video.fast_decode": FAST_DECODE, "video.video_backend": "pyav",
            "video.extra_options": {}}


@contextlib.contextmanager
def _quiet_svt() -> Iterator[None]:
    """SVT-AV1 prints its configuration to stderr at every encoder start unless ``SVT_LOG``
    says otherwise: errors only while this project encodes, unless the caller chose."""
    if "SVT_LOG" in os.environ:
        yield
        return
    os.environ["SVT_LOG"] = "1"
    try:
        yield
    finally:
        os.environ.pop("SVT_LOG", None)


def encode_video(path: Path, frames: np.ndarray, fps: float) -> dict[str, Any]:
    """Write ``frames`` (N, H, W, 3) uint8 RGB as an MP4 at ``path``, frame i at i / fps
    seconds; returns the feature ``info`` LeRobot records for it (``video.fps``, codec, pixel
    format, size, encoder settings)."""
    import av

    n, height, width, channels = frames.shape
    if channels != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected (N, H, W, 3) uint8 frames, got {frames.shape} {frames.dtype}")
    rate = Fraction(fps).limit_denominator(1001)
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"g": str(GOP), "crf": str(CRF), "preset": str(PRESET),
               "svtav1-params": f"fast-decode={FAST_DECODE}"}
    with _quiet_svt(), av.open(str(path), "w") as out:
        stream = cast("VideoStream", out.add_stream(CODEC, rate=rate, options=options))
        stream.pix_fmt = PIX_FMT
        stream.width, stream.height = width, height
        stream.time_base = 1 / rate
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return {"video.height": height, "video.width": width, "video.codec": "av1",
            "video.pix_fmt": PIX_FMT, "video.fps": round(float(rate)),
            "video.channels": 3, **encoder_info(), "has_audio": False, "is_depth_map": False}


def decode_video(root: Path, file: str, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of the MP4 ``file`` (relative to the dataset folder ``root``): (frames
    (N, H, W, 3) uint8 RGB, their presentation times (N,) float64 seconds), in time order. A
    file PyAV cannot read, or whose frames would take more than ``limit`` bytes, is a
    :class:`ConfigError` naming the folder and ``file``."""
    import av

    from stages.data import over_limit

    path = root / file
    if not path.is_file():
        raise ConfigError.one(root, file, None, "missing video file")
    frames: list[np.ndarray] = []
    times: list[float] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ConfigError.one(root, file, None, "holds no video stream")
            stream = container.streams.video[0]
            base = stream.time_base
            size = 3 * int(stream.codec_context.width) * int(stream.codec_context.height)
            if size * int(stream.frames or 0) > limit:
                raise over_limit(root, file, size * int(stream.frames), limit, stream.frames,
                                 f"{stream.frames} frames of {size} bytes")
            # One converter for every frame: a frame's own to_ndarray sets up the colour
            # conversion again each time, which costs more than decoding a small frame.
            rgb = av.video.reformatter.VideoReformatter()
            for frame in container.decode(stream):
                if frame.pts is None or base is None:
                    continue
                if size * (len(frames) + 1) > limit:
                    raise over_limit(root, file, size * (len(frames) + 1), limit, len(frames),
                                     "frames decoded so far")
                frames.append(rgb.reformat(frame, format="rgb24").to_ndarray())
                times.append(float(frame.pts * base))
    except av.error.FFmpegError as exc:
        raise ConfigError.one(root, file, None, f"unreadable video: {exc}") from None
    if not frames:
        raise ConfigError.one(root, file, 0, "no frames decoded")
    order = np.argsort(times, kind="stable")
    return np.stack(frames)[order], np.asarray(times, np.float64)[order]
