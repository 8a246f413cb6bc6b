"""Rendering throughput on reach-vision-v0: a validation rollout with cameras against a bare
``mujoco.Renderer`` loop, in frames per second.

Two measurements in one run, on the nominal scene of ``sim_scenes/reach_vision`` with N worlds
and the task's 64 x 64 front camera, both counted in frames (worlds x control steps) per wall
second:

- ``rollout``: :func:`stages.evaluation.rollout.rollout`, as the validate stage runs it, with a
  policy that reads the camera: every control step each world's look is painted, its front camera
  rendered (:meth:`MujocoBatchedEnv.camera_images`), and the policy gets ``obs`` and
  ``front_image``; it takes the image's mean brightness and answers the scripted expert's
  action. Then the episode's success, conditions and per-episode records.
- ``bare``: the same MJCF, worlds, image size and renderer settings (shadows and reflections
  off), one ``mujoco.Renderer``, and the least a batch needs to render a world right: every
  control step, for every world, ``Batch.get_data``, ``mj_kinematics`` and ``mj_camlight`` (the
  batch keeps no derived fields), ``update_scene`` and ``render``; then the same physics step of
  the whole batch (``frame_skip`` steps on the same threads). No policy, no observation.

And, over ``--tiled-worlds`` worlds (64) for ``--tiled-steps`` control steps:

- ``loop``: the ``bare`` loop above over those worlds, one ``mujoco.Renderer`` frame at a time;
- ``tiled``: the same loop with every world's frame drawn into the tiles of one framebuffer and
  read back once a step (:class:`stages.sim.env.tiled.TiledCameras`), the tiles spread over worker
  processes as ``auto`` chooses (``tiled_processes``; 1: this process), and
  ``tiled_in_process`` with every tile in this process. Each side makes the same images
  (tests/stages/sim/test_tiled_cameras.py), and the same physics step follows.

``frame_ms`` splits one 64 x 64 frame of the ``bare`` loop (median over ``--worlds`` worlds x
5 steps, ms): ``kinematics`` (``get_data``, ``mj_kinematics``, ``mj_camlight``),
``update_scene``, ``draw_calls`` (``mjr_render`` returning), ``rasterize`` (a ``glFinish``
after it), ``readback`` (``mjr_readPixels``); ``rasterize_without_multisampling`` is the same
with the model's ``offsamples`` at 0, to show where the rasterizer's time goes.

``ratio_tiled_over_loop`` (target >= 2) and ``ratio_tiled_in_process_over_loop`` are medians of
per-triple ratios of wall-clock rates, as above. The rollout renders as ``auto`` chooses for
``--worlds`` (below 32 worlds: tiles in this process).

Both make the same number of frames (the rollout renders before each of its control steps).
The renderers are created before the clock starts. Runs alternate ``--repeat`` times;
``ratio_rollout_over_bare`` (target >= 0.9) is the median of the per-pair ratios of wall-clock
rates, so a burst of other load hits both sides of a pair. The same ratio over the process's
CPU time (every thread's, the renderer's included) comes beside it: on a machine that other
work shares, it says what each loop costs where the wall clock says also how long it waited.
Needs offscreen OpenGL: ``MUJOCO_GL=egl`` (set here unless the environment sets it).

    MUJOCO_GL=egl python benchmarks/render_throughput.py [--worlds 16] [--steps 50] [--repeat 3]
        [--tiled-worlds 64] [--tiled-steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene
    from stages.sim.tasks.reach_vision import ReachVisionEnv

os.environ.setdefault("MUJOCO_GL", "egl")

ROOT = Path(__file__).resolve().parent.parent
NOMINAL_SCENE = ROOT / "sim_scenes" / "reach_vision" / "nominal.yaml"
SEED = 0


class ExpertThatLooks:
    """The scripted expert as a policy that reads the front camera: it reduces the image to
    its mean brightness and answers the expert's action."""

    inputs = ("obs", "front_image")

    def __init__(self, env: ReachVisionEnv) -> None:
        self._env = env
        self.brightness = 0.0

    def __call__(self, observation: Any) -> np.ndarray:
        """The expert's actions; ``observation``: ``obs`` and ``front_image``."""
        self.brightness = float(observation["front_image"].mean())
        return self._env.expert_action()


def _scene(steps: int) -> Scene:
    """The nominal scene in episodes of ``steps`` control steps."""
    from stages.sim.suites.loading import load_scene

    return load_scene(NOMINAL_SCENE).replace(episode_steps=steps)


def rollout_rate(worlds: int, steps: int) -> tuple[float, float]:
    """Frames per wall second and per CPU second of one validation rollout of the nominal
    scene, policy in the loop."""
    from stages.evaluation.rollout import rollout
    from stages.sim.tasks.reach_vision import ReachVisionEnv

    env = ReachVisionEnv(_scene(steps), worlds, SEED)
    try:
        env.reset()
        env.camera_images()  # the renderer, made before the clock starts
        start, cpu = time.perf_counter(), time.process_time()
        out = rollout(env, ExpertThatLooks(env))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        env.close()
    assert out.episodes is not None and len(out.success) == worlds
    return worlds * steps / seconds, worlds * steps / cpu


def bare_rate(worlds: int, steps: int) -> tuple[float, float]:
    """Frames per wall second and per CPU second of a bare ``mujoco.Renderer`` loop over the
    same worlds and physics."""
    import mujoco

    from stages.sim.tasks.reach_vision import ARM7_VISION_XML, CAMERAS, ReachVisionEnv

    camera = CAMERAS[0]
    env = ReachVisionEnv(_scene(steps), worlds, SEED)
    model = mujoco.MjModel.from_xml_path(str(ARM7_VISION_XML))
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, height=camera.height, width=camera.width)
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
    frames = np.empty((worlds, camera.height, camera.width, 3), dtype=np.uint8)
    try:
        env.reset()
        env.step(env.expert_action())  # the arm moving, as in the rollout
        batch = env.batch

        def draw() -> None:
            for world in range(worlds):
                batch.get_data(world, data)
                mujoco.mj_kinematics(model, data)
                mujoco.mj_camlight(model, data)
                renderer.update_scene(data, camera=camera.camera)
                renderer.render(out=frames[world])

        return _frame_rates(env, worlds, steps, draw)
    finally:
        renderer.close()
        env.close()


def _frame_rates(env: ReachVisionEnv, worlds: int, steps: int,
                 draw: Callable[[], None]) -> tuple[float, float]:
    """Frames per wall second and per CPU second (this process's) of ``steps`` control steps,
    each ``draw()`` of every world's frame, then the physics step of the whole batch."""
    batch, frame_skip = env.batch, env.frame_skip
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        draw()
        batch.step(nstep=frame_skip)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return worlds * steps / seconds, worlds * steps / cpu


def frame_split(worlds: int, samples: int | None = None, steps: int = 5) -> dict[str, float]:
    """Median milliseconds of each part of one frame of the ``bare`` loop (module doc), the
    model's multisampling set to ``samples`` when given."""
    import mujoco
    from mujoco.rendering.classic import gl_context
    from OpenGL import GL

    from stages.sim.tasks.reach_vision import ARM7_VISION_XML, CAMERAS, ReachVisionEnv

    camera = CAMERAS[0]
    env = ReachVisionEnv(_scene(steps), worlds, SEED)
    model = mujoco.MjModel.from_xml_path(str(ARM7_VISION_XML))
    if samples is not None:
        model.vis.quality.offsamples = samples
    data = mujoco.MjData(model)
    gl = gl_context.GLContext(camera.width, camera.height)
    gl.make_current()
    context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
    mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, context)
    scene = mujoco.MjvScene(model, maxgeom=10000)
    scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
    scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
    view = mujoco.MjvCamera()
    view.type, view.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, model.camera(camera.camera).id
    option, rect = mujoco.MjvOption(), mujoco.MjrRect(0, 0, camera.width, camera.height)
    frame = np.empty((camera.height, camera.width, 3), dtype=np.uint8)
    parts: dict[str, list[float]] = {k: [] for k in ("kinematics", "update_scene", "draw_calls",
                                                     "rasterize", "readback")}
    try:
        env.reset()
        for _ in range(steps):
            env.step(env.expert_action())
            for world in range(worlds):
                t0 = time.perf_counter()
                env.batch.get_data(world, data)
                mujoco.mj_kinematics(model, data)
                mujoco.mj_camlight(model, data)
                t1 = time.perf_counter()
                mujoco.mjv_updateScene(model, data, option, None, view,
                                       mujoco.mjtCatBit.mjCAT_ALL.value, scene)
                t2 = time.perf_counter()
                mujoco.mjr_render(rect, scene, context)
                t3 = time.perf_counter()
                GL.glFinish()
                t4 = time.perf_counter()
                mujoco.mjr_readPixels(frame, None, rect, context)
                t5 = time.perf_counter()
                for part, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4),
                                         strict=True):
                    parts[part].append(seconds)
    finally:
        with gl.as_current():
            context.free()
        gl.free()
        env.close()
    return {part: round(statistics.median(v) * 1e3, 3) for part, v in parts.items()}


def tiled_rate(worlds: int, steps: int, processes: int) -> tuple[float, float]:
    """Frames per wall second and per CPU second (this process's) of the ``bare`` loop with
    the frames drawn in tiles over ``processes`` processes (1: this one)."""
    import mujoco

    from stages.sim.env.tiled import TiledCameras
    from stages.sim.tasks.reach_vision import ARM7_VISION_XML, CAMERAS, ReachVisionEnv

    env = ReachVisionEnv(_scene(steps), worlds, SEED)
    model = mujoco.MjModel.from_xml_path(str(ARM7_VISION_XML))
    data = mujoco.MjData(model)
    tiles = TiledCameras(model, CAMERAS, worlds, processes)
    frames = {CAMERAS[0].image_key: np.empty((worlds, CAMERAS[0].height, CAMERAS[0].width, 3),
                                             dtype=np.uint8)}
    try:
        env.reset()
        env.step(env.expert_action())
        batch = env.batch

        def prepare(world: int) -> tuple[mujoco.MjModel, mujoco.MjData]:
            batch.get_data(world, data)
            mujoco.mj_kinematics(model, data)
            mujoco.mj_camlight(model, data)
            return model, data

        tiles.render(prepare, frames)  # every worker's first frames, outside the clock
        return _frame_rates(env, worlds, steps, lambda: tiles.render(prepare, frames))
    finally:
        tiles.close()
        env.close()


def tiled_fields(worlds: int, steps: int, repeat: int) -> dict[str, Any]:
    """The tiled-against-loop measurement's part of the JSON line (module doc)."""
    from stages.sim.env.tiled import tile_processes

    processes = tile_processes(worlds, "auto")
    loop, tiled, here = [], [], []
    for _ in range(repeat):
        loop.append(bare_rate(worlds, steps))
        tiled.append(tiled_rate(worlds, steps, processes))
        here.append(tiled_rate(worlds, steps, 1))
    ratio = statistics.median(t[0] / b[0] for t, b in zip(tiled, loop, strict=True))
    ratio_here = statistics.median(t[0] / b[0] for t, b in zip(here, loop, strict=True))
    return {
        "tiled_worlds": worlds,
        "tiled_steps": steps,
        "tiled_processes": processes,
        "loop_frames_per_s": round(statistics.median(b[0] for b in loop), 1),
        "tiled_frames_per_s": round(statistics.median(t[0] for t in tiled), 1),
        "tiled_in_process_frames_per_s": round(statistics.median(t[0] for t in here), 1),
        "ratio_tiled_over_loop": round(ratio, 3),
        "ratio_tiled_in_process_over_loop": round(ratio_here, 3),
        "target_tiled_over_loop_min": 2.0,
        "loop_runs": [round(b[0], 1) for b in loop],
        "tiled_runs": [round(t[0], 1) for t in tiled],
        "tiled_in_process_runs": [round(t[0], 1) for t in here],
    }


def main() -> None:
    """Measure both rates in alternating pairs; print the JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--worlds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=50, help="control steps per episode")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiled-worlds", type=int, default=64)
    parser.add_argument("--tiled-steps", type=int, default=20)
    args = parser.parse_args()

    from stages.sim.env.mujoco_env import default_num_threads

    load_before = os.getloadavg()
    rollout_rate(2, 2)  # imports and the first OpenGL context, outside every measurement
    rollout, bare = [], []
    for _ in range(args.repeat):
        rollout.append(rollout_rate(args.worlds, args.steps))
        bare.append(bare_rate(args.worlds, args.steps))
    tiled = tiled_fields(args.tiled_worlds, args.tiled_steps, args.repeat)
    split = frame_split(args.worlds)
    split["rasterize_without_multisampling"] = frame_split(args.worlds, samples=0)["rasterize"]
    wall = statistics.median(r[0] / b[0] for r, b in zip(rollout, bare, strict=True))
    cpu = statistics.median(r[1] / b[1] for r, b in zip(rollout, bare, strict=True))
    print(json.dumps({
        "benchmark": "render_throughput",
        "task": "reach-vision-v0",
        "scene": "nominal",
        "worlds": args.worlds,
        "steps": args.steps,
        "image": "64x64 rgb",
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "threads": default_num_threads(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "rollout_frames_per_s": round(statistics.median(r[0] for r in rollout), 1),
        "bare_frames_per_s": round(statistics.median(b[0] for b in bare), 1),
        "ratio_rollout_over_bare": round(wall, 3),
        "target_rollout_over_bare_min": 0.9,
        "rollout_frames_per_cpu_s": round(statistics.median(r[1] for r in rollout), 1),
        "bare_frames_per_cpu_s": round(statistics.median(b[1] for b in bare), 1),
        "ratio_cpu_rollout_over_bare": round(cpu, 3),
        "rollout_runs": [round(r[0], 1) for r in rollout],
        "bare_runs": [round(b[0], 1) for b in bare],
        **tiled,
        "frame_ms": split,
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
