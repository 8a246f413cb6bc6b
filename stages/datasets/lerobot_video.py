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
import math
import os
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from physai_core.errors import ConfigError
from stages.datasets.demonstrations import DecodeBudget

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


def decode_video(root: Path, file: str, budget: DecodeBudget,
                 check: Callable[[tuple[int, int, int]], None] | None = None,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of the MP4 ``file`` (relative to the dataset folder ``root``): (frames
    (N, H, W, 3) uint8 RGB, their presentation times (N,) float64 seconds), in time order.

    1. The stream's header gives the frame size: ``check(shape)`` (H, W, 3) may refuse it,
       then the frames the header counts are charged to ``budget``, before any is decoded;
    2. each frame decoded must have that size, and one past the header's count is charged
       before it is converted.

    A file PyAV cannot read, a frame of another size or frames past ``budget`` are a
    :class:`ConfigError` naming the folder and ``file``.
    """
    import av

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
            shape = (int(stream.codec_context.height), int(stream.codec_context.width), 3)
            if check is not None:
                check(shape)
            size = math.prod(shape)
            charged = max(0, int(stream.frames or 0))
            budget.charge(root, file, size * charged, charged,
                          f"{charged} frames of {shape[1]}x{shape[0]} RGB, from its header")
            # One converter for every frame: a frame's own to_ndarray sets up the colour
            # conversion again each time, which costs more than decoding a small frame.
            rgb = av.video.reformatter.VideoReformatter()
            for frame in container.decode(stream):
                if frame.pts is None or base is None:
                    continue
                if (frame.height, frame.width) != shape[:2]:
                    raise ConfigError.one(root, f"{file}:frame {len(frames)}",
                                          [frame.height, frame.width, 3],
                                          f"the stream's header gives frames of {list(shape)}")
                if len(frames) >= charged:
                    budget.charge(root, file, size, len(frames) + 1,
                                  "a frame past the count its header gives")
                    charged += 1
                frames.append(rgb.reformat(frame, format="rgb24").to_ndarray())
                times.append(float(frame.pts * base))
    except av.error.FFmpegError as exc:
        raise ConfigError.one(root, file, None, f"unreadable video: {exc}") from None
    if not frames:
        raise ConfigError.one(root, file, 0, "no frames decoded")
    out, when = np.stack(frames), np.asarray(times, np.float64)
    frames.clear()
    if np.all(np.diff(when) >= 0):
        return out, when
    order = np.argsort(when, kind="stable")
    return out[order], when[order]
