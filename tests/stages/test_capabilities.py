"""Simulators declare what they can do: no caller probes an environment with ``hasattr`` or
``getattr``; every backend's environment declares its capabilities; an environment that
declares nothing (a plugin's, or one on the bare protocol) still validates and trains."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.sim.env import capabilities as caps_module
from stages.sim.env.capabilities import NOTHING, EnvCapabilities, capabilities_of

ROOT = Path(__file__).resolve().parents[2]
STAGES = ROOT / "stages"

CAPABILITY_NAMES = frozenset(
    {f.name for f in dataclasses.fields(EnvCapabilities)}
    | {name for proto in (caps_module.Falls, caps_module.Restarts, caps_module.StatesMiss,
                          caps_module.ShowsCleanObservation, caps_module.TilesCameras,
                          caps_module.StepsOffThread)
       for name in vars(proto) if not name.startswith("_")}
    | {"capabilities", "camera_images", "camera_tiles", "body_poses"}
) - {"step"}
"""Attribute names that only an environment's optional capabilities have: probing any object
for one of them is a capability probe, whatever the object is called."""

FOREIGN_ENVIRONMENTS = {
    ("stages/sim/backends/gymnasium_tasks.py", "dt"),
    ("stages/sim/backends/gymnasium_env.py", "model"),
    ("stages/sim/backends/gymnasium_env.py", "data"),
}
"""The probes allowed, each (module, attribute): the Gymnasium adapter reading what another
library's environment has (a MuJoCo environment's ``model``, ``data`` and ``dt``, which a
Gymnasium environment of another simulator lacks). That library declares nothing; the adapter
is where its environments are read, and what it learns it declares in its own capabilities."""


def _names(node: ast.AST) -> Iterator[str]:
    """Every identifier in an expression: names and attribute names."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def capability_probes(source: str, path: str) -> list[str]:
    """Every ``hasattr``/``getattr`` call of ``source`` that probes an environment: its object
    names an environment (an identifier containing ``env``), or the attribute it asks for is a
    capability's (:data:`CAPABILITY_NAMES`); less :data:`FOREIGN_ENVIRONMENTS`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2):
            continue
        obj, attr = node.args[0], node.args[1]
        literal = attr.value if isinstance(attr, ast.Constant) else None
        on_env = any("env" in name.lower() for name in _names(obj))
        if not (on_env or literal in CAPABILITY_NAMES):
            continue
        if (path, literal) in FOREIGN_ENVIRONMENTS:
            continue
        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_stages_probes_an_environment() -> None:
    modules = sorted(STAGES.rglob("*.py"))
    assert len(modules) > 50
    probes = [probe for module in modules
              for probe in capability_probes(module.read_text(), str(module.relative_to(ROOT)))]
    assert probes == [], "\n".join(probes)


def test_the_rule_catches_the_probes_it_replaced() -> None:
    caught = [
        'fallen = getattr(env, "fallen", None)',
        'ok = hasattr(env, "restarted")',
        'tiles = hasattr(self.env, "camera_tiles")',
        'off = all(getattr(e, "steps_off_thread", False) for e in envs)',
        'close = getattr(env, "close", None)',
        'miss = getattr(group, "success_miss", None)',
    ]
    for line in caught:
        assert capability_probes(line, "stages/x.py"), line
    for line in ('reset = getattr(act, "reset", None)', 'n = getattr(cfg, field)',
                 'dt = getattr(env.unwrapped, "dt", None)'):
        assert not capability_probes(line, "stages/sim/backends/gymnasium_tasks.py"
                                     if "dt" in line else "stages/x.py"), line


class BareEnv:
    """The bare :class:`~stages.sim.env.batched.BatchedEnv` methods and nothing more (a
    plugin's environment written against the protocol, before capabilities): each world
    walks towards 1 with the action, and succeeds past 0.5."""

    def __init__(self, num_worlds: int = 3, episode_steps: int = 5) -> None:
        self.num_worlds, self.obs_dim, self.act_dim = num_worlds, 1, 1
        self.episode_steps = episode_steps
        self.closed = False
        self._x = np.zeros((num_worlds, 1), np.float32)

    def reset(self) -> np.ndarray:
        self._x[:] = 0.0
        self._t = 0
        return self._x.copy()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._x += 0.2 * np.clip(actions, -1.0, 1.0).astype(np.float32)
        self._t += 1
        done = np.full(self.num_worlds, self._t >= self.episode_steps)
        return self._x.copy(), self._x[:, 0].copy(), done

    def success(self) -> np.ndarray:
        return self._x[:, 0] > 0.5

    def expert_action(self) -> np.ndarray:
        return np.ones((self.num_worlds, 1), np.float32)

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        return np.zeros((len(worlds), height, width, 3), np.uint8)

    def close(self) -> None:
        self.closed = True


def _rollout() -> Any:
    from stages.evaluation.rollout import rollout

    return rollout


def test_an_environment_that_declares_nothing_can_do_nothing_more() -> None:
    from stages.sim.env.observation import camera_images

    env = BareEnv()
    assert capabilities_of(env) is NOTHING
    env.reset()
    assert camera_images(env) == {}


def test_an_environment_that_declares_nothing_validates_and_trains() -> None:
    from stages.sim.env.observation import camera_images
    from stages.sim.env.overlap import GroupedEnv
    from stages.training.rl_env import RslRlEnv

    torch = pytest.importorskip("torch")
    out = _rollout()(BareEnv(), lambda obs: np.where(np.arange(3)[:, None] < 2, 1.0, -1.0))
    assert out.success.tolist() == [True, True, False]
    assert out.episodes is not None and out.episodes["failure"].tolist() == ["", "", "missed"]
    grouped = GroupedEnv([BareEnv(2), BareEnv(1)])
    assert capabilities_of(grouped).falls and not capabilities_of(grouped).cameras
    grouped.reset()
    assert grouped.fallen().tolist() == [False] * 3 and camera_images(grouped) == {}
    grouped.close()
    assert all(g.closed for g in grouped.groups)
    rl = RslRlEnv(BareEnv(2, 3))  # type: ignore[arg-type]
    for _ in range(3):
        _, _, done, extras = rl.step(torch.ones((2, 1)))
    assert done.all() and extras["time_outs"].all()


@pytest.fixture()
def pointmass() -> Iterator[tuple[Any, Any]]:
    """The example plugin's task (examples/physai-pointmass, installed in the project's venv)
    and its nominal scene."""
    plugin = pytest.importorskip("physai_pointmass")
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    yield get_task("pointmass-v0"), load_scene(Path(plugin.__file__).parent
                                               / "scenes" / "nominal.yaml")


def test_the_example_plugin_declares_nothing_and_still_validates(
        pointmass: tuple[Any, Any]) -> None:
    from stages.sim.backends.catalog import make_backend_env

    spec, scene = pointmass
    env = make_backend_env("mujoco", spec, scene, 4, 3)
    try:
        declared = capabilities_of(env)
        assert not (declared.falls or declared.restarts or declared.cameras
                    or declared.tiled_cameras or declared.success_miss)
        assert declared.clean_observation and declared.body_layout and declared.model_draws
        out = _rollout()(env, lambda obs: env.expert_action())
        assert out.success.mean() >= 0.75
        assert "fell" not in out.episodes["failure"].tolist()
    finally:
        env.close()


def test_every_builtin_environment_declares_what_it_can_do() -> None:
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    scenes = ROOT / "sim_scenes"
    cases = {"reach-v0": (scenes / "reach" / "nominal.yaml", EnvCapabilities(
                 model_draws=True, body_layout=True, clean_observation=True,
                 steps_off_thread=True)),
             "locomotion-v0": (scenes / "locomotion" / "flat.yaml", EnvCapabilities(
                 falls=True, restarts=True, model_draws=True, body_layout=True,
                 clean_observation=True, steps_off_thread=True))}
    for task, (path, expected) in cases.items():
        if not path.is_file():
            path = next(p for p in sorted(path.parent.glob("*.yaml")) if p.name != "suite.yaml")
        env = get_task(task).make_env(load_scene(path), 2, 0)
        try:
            assert env.capabilities == expected, task
        finally:
            env.close()


def test_camera_tiles_reach_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_backend_env`` gives an environment that tiles its cameras the setting it is
    passed (``validate.camera_tiles``), else ``$PHYSAI_CAMERA_TILES``; the renderer reads no
    variable of its own."""
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.env.tiled import TILES_ENV
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    scene_dir = ROOT / "sim_scenes" / "reach_vision"
    scene = load_scene(next(p for p in sorted(scene_dir.glob("*.yaml")) if p.name != "suite.yaml"))
    spec = get_task("reach-vision-v0")
    monkeypatch.setenv(TILES_ENV, "3")
    for given, expected in (("off", "off"), (None, "3")):
        env: Any = make_backend_env("mujoco", spec, scene, 2, 0, camera_tiles=given)
        try:
            assert capabilities_of(env).tiled_cameras
            assert env.camera_tiles == expected
        finally:
            env.close()
    tiled_source = (STAGES / "sim" / "env" / "tiled.py").read_text()
    assert "import stages.core.settings" not in tiled_source and "os.environ" not in tiled_source
    assert "from stages.core.settings" not in tiled_source
