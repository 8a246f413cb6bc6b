"""Tiled cameras: many worlds' frames of one camera drawn into the tiles of one offscreen
framebuffer and read back in one call.

A :class:`TileCanvas` owns one OpenGL context and one ``MjrContext``. Each world's scene
(``mjv_updateScene``) is drawn by ``mjr_render`` at the origin of the context's multisampled
offscreen buffer, exactly where a ``mujoco.Renderer`` of the same size draws it, and resolved
(``glBlitFramebuffer``) into the world's tile of one single-sampled framebuffer the size of the
tile grid; one ``glReadPixels`` then reads every tile, and the grid is sliced into per-world
images, bit-identical to rendering one world at a time.

Why at the origin and not at the tile's offset: a viewport per tile would keep every tile in one
rasterizer pass, but the viewport transform adds the tile's offset to each vertex in float32
before snapping it to the rasterizer's sub-pixel grid, which rounds some vertices the other way:
64 worlds at 64 x 64 differed in 32 pixels by up to 2 levels of 255.

Where the time goes (Mesa llvmpipe, ``MUJOCO_GL=egl``, reach-vision-v0's 64 x 64 camera, 4x
multisampling as the model asks): of about 4 ms a frame, ``mjr_render``'s draw calls take about
1 ms, rasterizing them about 2.7 ms (0.35 ms without multisampling: the cost is per triangle and
sample, and the arm's capsules are thousands of triangles), the readback about 0.2 ms,
``mjv_updateScene`` and the world's kinematics about 0.05 ms. Tiling saves the readbacks, not
the rasterizing (and the resolve still waits for each world's frame). Threads do not help
either: two threads with a context each ran no faster than one, as if the contexts of one
process shared the rasterizer. So :class:`TileWorkers` spreads the worlds over worker
processes, each with its own canvas, fed each step through shared memory: a world's state
(``qpos`` and mocap poses) and its look (:data:`LOOK_FIELDS` of the painted model), and
answering its tiles.

How many processes render is :data:`TILES_ENV` (see :func:`tile_processes`); ``off`` renders
one world at a time with a ``mujoco.Renderer``, the baseline.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
import multiprocessing
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    import mujoco

    from stages.sim.env.cameras import CameraSpec

__all__ = ["LOOK_FIELDS", "TILES_ENV", "WORLDS_PER_PROCESS", "TileCamera", "TileCanvas",
           "TileSet", "TileWorkers", "TiledCameras", "tile_processes"]

_log = logging.getLogger(__name__)

TILES_ENV = "PHYSAI_CAMERA_TILES"
"""Environment variable that chooses how cameras render when ``validate.camera_tiles`` does not
(read by :func:`stages.core.settings.camera_tiles` alone; :func:`tile_processes`)."""

WORLDS_PER_PROCESS = 16
"""Fewest worlds per worker process that ``auto`` spreads tiles over: below that, starting a
process (about a second) costs more than it saves."""

MAX_GRID_SIDE = 8192
"""Largest side (pixels) of one canvas's tile grid; more worlds are drawn in several rounds."""

LOOK_FIELDS = ("light_ambient", "light_diffuse", "light_specular", "light_dir", "geom_rgba",
               "cam_pos", "cam_quat")
"""Model fields a world's look may change (:meth:`MujocoBatchedEnv._paint` and
``_paint_scene``), besides the headlight's colours: what a worker process copies per world."""

_HEADLIGHT = ("ambient", "diffuse", "specular")
"""The headlight's colours a world's look may scale."""


def tile_processes(num_worlds: int, value: str) -> int:
    """How cameras render, from ``value``: an environment's setting, given it once by
    :func:`~stages.sim.backends.catalog.make_backend_env` (``validate.camera_tiles``, else
    ``$PHYSAI_CAMERA_TILES``, read by :func:`stages.core.settings.camera_tiles`).

    Returns -1 for ``off`` (or ``0``): one world at a time, a ``mujoco.Renderer`` per camera
    size; 1 for ``on`` (or ``1``): tiles of one framebuffer in this process; n for an integer
    n >= 2: tiles spread over n worker processes; for ``auto``: over
    min(CPUs, num_worlds // :data:`WORLDS_PER_PROCESS`) processes when that is at least 2,
    else 1. Anything else is refused.
    """
    text = value.strip().lower() or "auto"
    if text in ("off", "0"):
        return -1
    if text == "on":
        return 1
    if text == "auto":
        n = min(os.cpu_count() or 1, num_worlds // WORLDS_PER_PROCESS)
        return n if n >= 2 else 1
    if text.isdigit():
        return int(text)
    raise ValueError(f"camera tiles must be off, on, auto or a process count, got {value!r}")


@dataclass(frozen=True)
class TileCamera:
    """One camera to tile: the model's camera and its image size."""

    camera_id: int
    """Id of the model's camera."""
    width: int
    """Image width (pixels)."""
    height: int
    """Image height (pixels)."""


class TileCanvas:
    """One OpenGL context whose offscreen framebuffer holds a grid of same-sized tiles.

    Shadows and reflections are off, as for the per-world renderer; multisampling is the
    model's (``vis.quality.offsamples``).
    """

    def __init__(self, model: mujoco.MjModel, width: int, height: int, count: int) -> None:
        """A canvas of at least ``count`` tiles (fewer when the grid would pass
        :data:`MAX_GRID_SIDE`: :attr:`capacity` says) of ``width`` x ``height`` pixels for
        scenes of ``model``."""
        import mujoco
        from mujoco.rendering.classic import gl_context
        from OpenGL import GL

        if width > MAX_GRID_SIDE or height > MAX_GRID_SIDE:
            raise ValueError(f"tile {width} x {height} is larger than {MAX_GRID_SIDE} pixels")
        self.width, self.height = width, height
        self.cols = max(1, min(count, MAX_GRID_SIDE // width, math.ceil(math.sqrt(count))))
        self.rows = max(1, min(math.ceil(count / self.cols), MAX_GRID_SIDE // height))
        self.capacity = self.cols * self.rows
        grid_w, grid_h = self.cols * width, self.rows * height
        sized = copy.copy(model)
        sized.vis.global_.offwidth = max(sized.vis.global_.offwidth, grid_w)
        sized.vis.global_.offheight = max(sized.vis.global_.offheight, grid_h)
        self._gl = gl_context.GLContext(grid_w, grid_h)
        self._gl.make_current()
        self._ctx = mujoco.MjrContext(sized, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._ctx)
        self._scene = mujoco.MjvScene(sized, maxgeom=10000)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._origin = mujoco.MjrRect(0, 0, width, height)
        self._fbo = int(GL.glGenFramebuffers(1))
        self._color = int(GL.glGenRenderbuffers(1))
        GL.glBindRenderbuffer(GL.GL_RENDERBUFFER, self._color)
        GL.glRenderbufferStorage(GL.GL_RENDERBUFFER, GL.GL_RGBA8, grid_w, grid_h)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self._fbo)
        GL.glFramebufferRenderbuffer(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0,
                                     GL.GL_RENDERBUFFER, self._color)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._ctx)
        self._grid = np.empty((grid_h, grid_w, 3), dtype=np.uint8)

    def draw(self, tile: int, model: mujoco.MjModel, data: mujoco.MjData,
             camera_id: int) -> None:
        """Draw ``data`` (kinematics and ``mj_camlight`` done) of ``model`` through camera
        ``camera_id`` into tile ``tile`` (row-major from the top left, < :attr:`capacity`)."""
        import mujoco
        from OpenGL import GL

        self._gl.make_current()
        self._camera.fixedcamid = camera_id
        mujoco.mjv_updateScene(model, data, self._option, None, self._camera,
                               mujoco.mjtCatBit.mjCAT_ALL.value, self._scene)
        mujoco.mjr_render(self._origin, self._scene, self._ctx)
        row, col = divmod(tile, self.cols)
        x0, y0 = col * self.width, (self.rows - 1 - row) * self.height
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, self._ctx.offFBO)
        GL.glBindFramebuffer(GL.GL_DRAW_FRAMEBUFFER, self._fbo)
        GL.glBlitFramebuffer(0, 0, self.width, self.height, x0, y0, x0 + self.width,
                             y0 + self.height, GL.GL_COLOR_BUFFER_BIT, GL.GL_NEAREST)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._ctx)

    def read(self, count: int, out: np.ndarray) -> None:
        """Read the first ``count`` tiles back in one call into ``out``, top row first.
        ``out``: shape (>= count, height, width, 3), uint8."""
        import mujoco
        from OpenGL import GL

        self._gl.make_current()
        rows = math.ceil(count / self.cols)
        grid = self._grid[:rows * self.height]
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, self._fbo)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        GL.glReadPixels(0, (self.rows - rows) * self.height, self.cols * self.width,
                        rows * self.height, GL.GL_RGB, GL.GL_UNSIGNED_BYTE, grid)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._ctx)
        tiles = grid[::-1].reshape(rows, self.height, self.cols, self.width, 3)
        tiles = tiles.transpose(0, 2, 1, 3, 4).reshape(rows * self.cols, self.height,
                                                        self.width, 3)
        out[:count] = tiles[:count]

    def close(self) -> None:
        """Free the framebuffers and the OpenGL context."""
        if self._gl is None:
            return
        from OpenGL import GL

        with self._gl.as_current():
            GL.glDeleteFramebuffers(1, [self._fbo])
            GL.glDeleteRenderbuffers(1, [self._color])
            self._ctx.free()
        self._gl.free()
        self._gl = None


class TileSet:
    """A canvas per camera, drawing many worlds' frames of each camera and reading each
    camera's frames back once per round of :attr:`TileCanvas.capacity` worlds. (Two cameras
    of one size on one canvas would draw over each other's tiles before either is read.)"""

    def __init__(self, model: mujoco.MjModel, cameras: Sequence[TileCamera],
                 num_worlds: int) -> None:
        """Canvases for ``num_worlds`` worlds' frames of ``cameras`` (scenes of ``model``)."""
        self.cameras = tuple(cameras)
        self._canvases: dict[tuple[int, int, int], TileCanvas] = {}
        for cam in self.cameras:
            if _canvas_key(cam) not in self._canvases:
                self._canvases[_canvas_key(cam)] = TileCanvas(
                    model, cam.width, cam.height, num_worlds)

    @property
    def capacity(self) -> int:
        """Worlds every canvas holds at once."""
        return min(canvas.capacity for canvas in self._canvases.values())

    def canvas(self, cam: TileCamera) -> TileCanvas:
        """The canvas of ``cam``."""
        return self._canvases[_canvas_key(cam)]

    def close(self) -> None:
        """Free every canvas."""
        for canvas in self._canvases.values():
            canvas.close()
        self._canvases.clear()


def _canvas_key(cam: TileCamera) -> tuple[int, int, int]:
    """What one canvas draws: a model camera at one image size."""
    return (cam.camera_id, cam.width, cam.height)


def look_width(model: mujoco.MjModel) -> int:
    """Numbers in one world's look: :data:`LOOK_FIELDS` and the headlight's colours."""
    return sum(getattr(model, f).size for f in LOOK_FIELDS) + 3 * len(_HEADLIGHT)


def read_look(model: mujoco.MjModel, row: np.ndarray) -> None:
    """Copy ``model``'s look (:data:`LOOK_FIELDS`, headlight colours) into ``row``."""
    at = 0
    for name in LOOK_FIELDS:
        field = getattr(model, name)
        row[at:at + field.size] = field.ravel()
        at += field.size
    for name in _HEADLIGHT:
        row[at:at + 3] = getattr(model.vis.headlight, name)
        at += 3


def write_look(row: np.ndarray, model: mujoco.MjModel) -> None:
    """Write a look read by :func:`read_look` into ``model``."""
    at = 0
    for name in LOOK_FIELDS:
        field = getattr(model, name)
        field[...] = row[at:at + field.size].reshape(field.shape)
        at += field.size
    for name in _HEADLIGHT:
        getattr(model.vis.headlight, name)[:] = row[at:at + 3]
        at += 3


@dataclass(frozen=True)
class _Layout:
    """Where one world's numbers lie in a row of the shared input array."""

    nq: int
    nmocap: int
    look: int

    @property
    def width(self) -> int:
        """Numbers per world."""
        return self.nq + 7 * self.nmocap + self.look


def _row_state(layout: _Layout, row: np.ndarray, data: mujoco.MjData) -> None:
    """Write a world's ``qpos`` and mocap poses from ``row`` into ``data``."""
    nq, nm = layout.nq, layout.nmocap
    data.qpos[:] = row[:nq]
    data.mocap_pos[:] = row[nq:nq + 3 * nm].reshape(nm, 3)
    data.mocap_quat[:] = row[nq + 3 * nm:nq + 7 * nm].reshape(nm, 4)


def _worker(conn: Connection, model: mujoco.MjModel, cameras: tuple[TileCamera, ...],
            worlds: tuple[int, int], num_worlds: int, inputs: str,
            outputs: tuple[str, ...]) -> None:
    """A worker process: draw worlds ``worlds[0]`` .. ``worlds[1] - 1`` on every ``render``
    message, from the shared input rows into the shared output images; ``close`` ends it."""
    shm_in = shared_memory.SharedMemory(inputs)
    shm_out = [shared_memory.SharedMemory(name) for name in outputs]
    try:
        _serve(conn, model, cameras, worlds, num_worlds, shm_in, shm_out)
    finally:
        shm_in.close()
        for shm in shm_out:
            shm.close()


def _serve(conn: Connection, model: mujoco.MjModel, cameras: tuple[TileCamera, ...],
           worlds: tuple[int, int], num_worlds: int, shm_in: shared_memory.SharedMemory,
           shm_out: list[shared_memory.SharedMemory]) -> None:
    """The worker's loop over the shared arrays (see :func:`_worker`)."""
    import mujoco

    layout = _Layout(model.nq, model.nmocap, look_width(model))
    rows = np.ndarray((num_worlds, layout.width), dtype=np.float64, buffer=shm_in.buf)
    images = [np.ndarray((num_worlds, c.height, c.width, 3), dtype=np.uint8, buffer=s.buf)
              for c, s in zip(cameras, shm_out, strict=True)]
    data = mujoco.MjData(model)
    first, stop = worlds
    tiles = TileSet(model, cameras, stop - first)
    try:
        conn.send("ready")
        while conn.recv() == "render":
            for start in range(first, stop, tiles.capacity):
                _draw_round(tiles, model, data, layout, rows, images, start, stop)
            conn.send("done")
    finally:
        tiles.close()


def _draw_round(tiles: TileSet, model: mujoco.MjModel, data: mujoco.MjData, layout: _Layout,
                rows: np.ndarray, images: list[np.ndarray], start: int, stop: int) -> None:
    """Draw worlds ``start`` .. as many as a canvas holds (before ``stop``) from ``rows``, and
    read each camera's tiles into ``images``."""
    import mujoco

    end = min(stop, start + tiles.capacity)
    for tile, world in enumerate(range(start, end)):
        _row_state(layout, rows[world], data)
        write_look(rows[world, layout.width - layout.look:], model)
        mujoco.mj_kinematics(model, data)
        mujoco.mj_camlight(model, data)
        for cam in tiles.cameras:
            tiles.canvas(cam).draw(tile, model, data, cam.camera_id)
    for cam, out in zip(tiles.cameras, images, strict=True):
        tiles.canvas(cam).read(end - start, out[start:end])


def _stop(conns: list[Connection], procs: list[BaseProcess],
          memory: list[shared_memory.SharedMemory]) -> None:
    """Stop worker processes (asked, then ended after 10 s) and free their shared memory; also
    run when a :class:`TileWorkers` is collected unclosed."""
    for conn in conns:
        with contextlib.suppress(BrokenPipeError, OSError):
            conn.send("close")
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join()
    for conn in conns:
        conn.close()
    for shm in memory:
        with contextlib.suppress(BufferError):
            shm.close()
        shm.unlink()


class TileWorkers:
    """Worker processes that each draw a contiguous share of the worlds into their tiles.

    Every step the caller fills :attr:`rows` (a world's ``qpos``, mocap positions and
    orientations, then its look; :meth:`put`), calls :meth:`render` and reads the images.
    """

    def __init__(self, model: mujoco.MjModel, cameras: Sequence[TileCamera], num_worlds: int,
                 processes: int) -> None:
        """Start ``processes`` workers (at most one per world) for ``num_worlds`` worlds'
        frames of ``cameras``, scenes of ``model`` (each worker gets a copy)."""
        self.cameras = tuple(cameras)
        self._layout = _Layout(model.nq, model.nmocap, look_width(model))
        n = max(1, min(processes, num_worlds))
        self._shm_in = shared_memory.SharedMemory(create=True,
                                                  size=8 * num_worlds * self._layout.width)
        self._shm_out = [shared_memory.SharedMemory(create=True,
                                                    size=num_worlds * c.height * c.width * 3)
                         for c in self.cameras]
        self.rows = np.ndarray((num_worlds, self._layout.width), dtype=np.float64,
                               buffer=self._shm_in.buf)
        self.images = [np.ndarray((num_worlds, c.height, c.width, 3), dtype=np.uint8,
                                  buffer=s.buf) for c, s in zip(self.cameras, self._shm_out,
                                                                strict=True)]
        bounds = np.linspace(0, num_worlds, n + 1).round().astype(int)
        self._shares = [(int(first), int(stop)) for first, stop in itertools.pairwise(bounds)]
        """Each worker's worlds, ``first`` .. ``stop - 1``."""
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for first, stop in self._shares:
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=_worker, daemon=True,
                args=(theirs, model, self.cameras, (first, stop), num_worlds,
                      self._shm_in.name, tuple(s.name for s in self._shm_out)))
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs,
                                           [self._shm_in, *self._shm_out])
        self._expect("ready")

    def put(self, world: int, model: mujoco.MjModel, data: mujoco.MjData) -> None:
        """Write world ``world``'s state (``data``) and look (``model``) into :attr:`rows`."""
        row, nq, nm = self.rows[world], self._layout.nq, self._layout.nmocap
        row[:nq] = data.qpos
        row[nq:nq + 3 * nm] = data.mocap_pos.ravel()
        row[nq + 3 * nm:nq + 7 * nm] = data.mocap_quat.ravel()
        read_look(model, row[nq + 7 * nm:])

    def render(self, prepare: Callable[[int], tuple[mujoco.MjModel, mujoco.MjData]] | None
               = None) -> None:
        """Every worker draws its worlds from :attr:`rows` into :attr:`images`.

        With ``prepare`` (see :meth:`TiledCameras.render`), each worker's worlds are
        :meth:`put` first, and it starts drawing them while the next worker's are prepared:
        this process's share of the work (painting, kinematics) overlaps the drawing."""
        for conn, (first, stop) in zip(self._conns, self._shares, strict=True):
            if prepare is not None:
                for world in range(first, stop):
                    self.put(world, *prepare(world))
            conn.send("render")
        self._expect("done")

    def _expect(self, word: str) -> None:
        """Wait for ``word`` from every worker; a worker that died is an error."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            try:
                answer: Any = conn.recv()
            except EOFError:
                answer = None
            if answer != word:
                self.close()
                raise RuntimeError(f"tiled camera worker {proc.name} stopped (exit code "
                                   f"{proc.exitcode}) before answering {word!r}")

    def close(self) -> None:
        """Stop the workers and free the shared memory; a second call does nothing."""
        self.rows = np.empty((0, 0))
        self.images = []
        self._finalizer()


class TiledCameras:
    """Every world's frames of a task's colour cameras, drawn in tiles: in this process
    (``processes`` 1) or spread over worker processes (``processes`` >= 2)."""

    def __init__(self, model: mujoco.MjModel, cameras: Sequence[CameraSpec], num_worlds: int,
                 processes: int) -> None:
        """Canvases (or workers) for ``num_worlds`` worlds' frames of ``cameras``, each a colour
        camera of ``model`` (the copy the worlds are painted into)."""
        import mujoco

        refused = [cam.name for cam in cameras if cam.depth or not cam.rgb]
        if refused:
            raise ValueError(f"tiled cameras draw colour images only; {refused} ask for depth")
        self.cameras = tuple(cameras)
        self._num_worlds = num_worlds
        tile_cameras = [TileCamera(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA,
                                                     cam.camera), cam.width, cam.height)
                        for cam in self.cameras]
        self._tiles: TileSet | None = None
        self._workers: TileWorkers | None = None
        self.processes = processes
        """The process count asked for (:func:`tile_processes`)."""
        if processes >= 2 and multiprocessing.current_process().daemon:
            _log.warning("a daemonic process cannot start tile workers: tiles drawn here")
            processes = 1
        if processes >= 2:
            self._workers = TileWorkers(model, tile_cameras, num_worlds, processes)
        else:
            self._tiles = TileSet(model, tile_cameras, num_worlds)

    def render(self, prepare: Callable[[int], tuple[mujoco.MjModel, mujoco.MjData]],
               out: Mapping[str, np.ndarray]) -> None:
        """Draw every world's frames into ``out`` (``<camera>_image``, (N, height, width, 3)
        uint8). ``prepare(world)`` paints the world's look into the model and fills the data
        (state, kinematics, ``mj_camlight``), and returns both."""
        if self._workers is not None:
            self._workers.render(prepare)
            for cam, images in zip(self.cameras, self._workers.images, strict=True):
                out[cam.image_key][...] = images
            return
        tiles = self._tiles
        if tiles is None:
            raise RuntimeError("tiled cameras are closed")
        for start in range(0, self._num_worlds, tiles.capacity):
            end = min(self._num_worlds, start + tiles.capacity)
            for tile, world in enumerate(range(start, end)):
                model, data = prepare(world)
                for tcam in tiles.cameras:
                    tiles.canvas(tcam).draw(tile, model, data, tcam.camera_id)
            for cam, tcam in zip(self.cameras, tiles.cameras, strict=True):
                tiles.canvas(tcam).read(end - start, out[cam.image_key][start:end])

    def close(self) -> None:
        """Free the canvases or stop the workers."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self._tiles is not None:
            self._tiles.close()
            self._tiles = None
