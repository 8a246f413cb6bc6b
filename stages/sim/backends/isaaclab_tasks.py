"""Isaac Lab's own registered tasks as batched environments: ``task: isaaclab:<gym id>``.

Isaac Lab 3 registers its tasks with Gymnasium when ``isaaclab_tasks`` is imported
(``Isaac-Cartpole-Direct``, ...). This module builds such a task in Isaac Lab's kit-less mode:
the env config is resolved with the ``newton_mjwarp`` physics preset (Newton, MuJoCo-Warp
solver), simulated on :func:`~stages.sim.backends.isaaclab_robot.sim_device`'s device with CUDA
graphs off on the CPU, and the task's remote assets replaced by local files (:data:`LOCAL_ASSETS`).
Isaac Lab 3 dropped the ``-v0`` suffix of its ids; ``Isaac-Cartpole-Direct-v0`` (Isaac Lab 2's
spelling) names ``Isaac-Cartpole-Direct``.

Episodes follow :class:`~stages.sim.env.vector_env.VectorEpisodes`, as Gymnasium tasks do: they
last the scene's ``episode_steps`` (Isaac Lab's own time limit is set longer, so it never cuts
one); a world whose env terminates keeps its final observation, earns no more reward and waits
for the others, unless ``step(..., restart_fallen=True)`` asks for Isaac Lab's own restart
(PPO training).

``python -m stages.sim.backends.isaaclab_tasks describe Isaac-Cartpole-Direct-v0`` prints
:func:`describe` as one JSON line. Isaac Lab is imported inside functions only: without it,
they raise :class:`physai_core.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import difflib
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from physai_core.errors import BackendUnavailableError, PhysaiError, UnknownNameError
from stages.sim.backends.isaaclab_robot import WARP_CACHE_ENV, sim_device
from stages.sim.env.vector_env import VectorEpisodes

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene, SuccessConfig

PREFIX = "isaaclab"
"""Task ids of the family (:mod:`stages.sim.backends.isaaclab_family`) are ``isaaclab:<gym id>``."""


class IsaacLabTaskError(UnknownNameError):
    """An ``isaaclab:<id>`` task that cannot be had: an unknown id (the message names close
    matches and a few registered ids) or a config the adapter cannot run."""

    def __init__(self, message: str) -> None:
        self.message = " ".join(message.split())
        Exception.__init__(self, self.message)


PHYSICS_PRESET = "newton_mjwarp"
"""Isaac Lab physics preset every task is resolved with: Newton's MuJoCo-Warp solver."""

OBS_GROUP = "policy"
"""The observation group of Isaac Lab's env that is the policy's observation."""

_VERSION_SUFFIX = re.compile(r"-v[0-9]+$")


@dataclass(frozen=True)
class LocalAsset:
    """A local USD file that replaces a remote asset of a task's env config."""

    field: str
    """Dotted path of the config attribute holding the asset's path, e.g.
    ``scene.cartpole.spawn.usd_path``."""
    package: str
    """Installed package whose folder holds the file, e.g. ``newton``."""
    file: str
    """Path of the file inside the package's folder."""
    prim: str
    """Prim of the file to spawn; a small wrapper layer referencing it is written when the
    file's own default prim does not name it."""


@dataclass(frozen=True)
class TaskAssets:
    """How a task's env config is pointed at local files (its stock assets are remote)."""

    replace: tuple[LocalAsset, ...]
    """Assets replaced by local files."""
    drop: tuple[str, ...]
    """Dotted paths of scene entities set to None: remote decorations the task does not need."""


LOCAL_ASSETS: dict[str, TaskAssets] = {
    "Isaac-Cartpole-Direct": TaskAssets(
        replace=(
            LocalAsset(
                field="scene.cartpole.spawn.usd_path",
                package="newton",
                file="examples/assets/cartpole_single_pendulum.usda",
                prim="/cartpole",
            ),
        ),
        drop=("scene.ground",),
    ),
}
"""Per Isaac Lab id, the local files of its assets. The newton wheel's
``cartpole_single_pendulum.usda`` is Isaac Lab's own cartpole (joints ``slider_to_cart`` and
``cart_to_pole``; its ``cartpole.usda`` is a double pendulum with other joint names), but its
default prim is misspelt (``cartPole``), hence the wrapper layer. The ground plane is dropped:
the cart rides a rail 2 m up and touches nothing."""



def _first_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _isaaclab_tasks() -> Any:
    """``gymnasium`` once Isaac Lab's tasks are registered with it; a missing install raises
    BackendUnavailableError naming the isaaclab environment."""
    try:
        import gymnasium
        import isaaclab_tasks  # noqa: F401  (registers Isaac Lab's tasks)
    except ImportError as exc:
        raise BackendUnavailableError(PREFIX, PREFIX, exc, environment=PREFIX) from exc
    return gymnasium


def registered_ids() -> list[str]:
    """Every Gymnasium id that Isaac Lab registered (those with an env config), sorted."""
    gym = _isaaclab_tasks()
    return sorted(k for k, spec in gym.registry.items() if "env_cfg_entry_point" in spec.kwargs)


def resolve_gym_id(name: str) -> str:
    """The registered Isaac Lab id that ``name`` names: itself, or without a ``-v<N>``
    suffix; an unknown one raises :class:`IsaacLabTaskError` with close matches."""
    ids = registered_ids()
    known = set(ids)
    if name in known:
        return name
    bare = _VERSION_SUFFIX.sub("", name)
    if bare in known:
        return bare
    close = difflib.get_close_matches(bare, ids, n=3, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise IsaacLabTaskError(
        f"unknown Isaac Lab task {name!r} ({hint}; {len(ids)} are registered, e.g. "
        f"{', '.join(ids[:5])})"
    )


def _env_cfg(gym_id: str) -> Any:
    """Isaac Lab's env config of ``gym_id`` with the :data:`PHYSICS_PRESET` physics preset
    (what Isaac Lab prints meanwhile goes to stderr); only a direct-workflow config
    (``DirectRLEnvCfg``) is accepted."""
    _isaaclab_tasks()
    from isaaclab.envs import DirectRLEnvCfg
    from isaaclab_tasks.utils.hydra import resolve_task_config

    try:
        with contextlib.redirect_stdout(sys.stderr):
            cfg, _ = resolve_task_config(gym_id, "", overrides=(f"presets={PHYSICS_PRESET}",))
    except Exception as exc:
        raise IsaacLabTaskError(f"Isaac Lab task {gym_id!r} has no config with the "
                                f"{PHYSICS_PRESET} preset: {_first_line(exc)}") from None
    if not isinstance(cfg, DirectRLEnvCfg):
        raise IsaacLabTaskError(f"Isaac Lab task {gym_id!r} is a {type(cfg).__name__}; only "
                                "direct-workflow tasks (DirectRLEnvCfg) are supported")
    return cfg


def _spaces(cfg: Any) -> tuple[Any, Any]:
    """The single-world observation and action spaces a direct env config declares."""
    from isaaclab.envs.utils.spaces import spec_to_gym_space

    return spec_to_gym_space(cfg.observation_space), spec_to_gym_space(cfg.action_space)


def describe(gym_id: str) -> dict[str, object]:
    """JSON-able facts about an Isaac Lab task, read from its config (no env is built).

    Returns:
        ``gym_id`` (the registered id), ``obs_dim``, ``act_dim``, ``obs_names`` (a Dict
        space's keys, else ``obs[i]``), ``action_names``, ``control_hz`` (1 / (sim.dt *
        decimation)), ``action_scale`` (what the env multiplies an action by, or None),
        ``local_assets`` (whether :data:`LOCAL_ASSETS` lets it build here) and
        ``isaaclab_version``.
    """
    from gymnasium import spaces

    from stages.sim.backends.gymnasium_tasks import space_names

    resolved = resolve_gym_id(gym_id)
    cfg = _env_cfg(resolved)
    obs_space, act_space = _spaces(cfg)
    scale = getattr(cfg, "action_scale", None)
    return {
        "gym_id": resolved,
        "obs_dim": spaces.flatdim(obs_space),
        "act_dim": spaces.flatdim(act_space),
        "obs_names": space_names(obs_space, ""),
        "action_names": space_names(act_space, "act"),
        "control_hz": 1.0 / (cfg.sim.dt * cfg.decimation),
        "action_scale": float(scale) if isinstance(scale, (int, float)) else None,
        "local_assets": resolved in LOCAL_ASSETS,
        "isaaclab_version": importlib.metadata.version("isaaclab"),
    }


def _set_path(cfg: Any, dotted: str, value: object) -> None:
    """Set the config attribute at ``dotted`` (``scene.cartpole.spawn.usd_path``)."""
    *parents, leaf = dotted.split(".")
    obj = cfg
    for name in parents:
        obj = getattr(obj, name)
    if not hasattr(obj, leaf):
        raise IsaacLabTaskError(f"env config has no field {dotted!r} to point at a local asset")
    setattr(obj, leaf, value)


def _local_usd(asset: LocalAsset) -> str:
    """The path to spawn ``asset`` from: a wrapper layer (in the temp folder, named by the
    source's path and bytes) whose default prim references ``asset.prim`` of the file."""
    import importlib.util

    spec = importlib.util.find_spec(asset.package)
    if spec is None or spec.origin is None:
        raise IsaacLabTaskError(f"package {asset.package!r} holding {asset.file} is not installed")
    source = Path(spec.origin).parent / asset.file
    if not source.is_file():
        raise IsaacLabTaskError(f"local asset {source} is missing")
    digest = hashlib.sha256(str(source).encode() + source.read_bytes()).hexdigest()[:16]
    name = asset.prim.rsplit("/", 1)[-1]
    wrapper = Path(tempfile.gettempdir()) / "physai-isaaclab-assets" / f"{name}-{digest}.usda"
    if not wrapper.is_file():
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        text = (f'#usda 1.0\n(\n    defaultPrim = "{name}"\n    metersPerUnit = 1\n'
                f'    kilogramsPerUnit = 1\n    upAxis = "Z"\n)\n\ndef Xform "{name}" (\n'
                f"    prepend references = @{source}@<{asset.prim}>\n)\n{{\n}}\n")
        partial = wrapper.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(wrapper)
    return str(wrapper)


def _build_cfg(gym_id: str, num_worlds: int, seed: int, device: str, episode_steps: int) -> Any:
    """The env config of ``gym_id`` for this adapter: ``num_worlds`` worlds, ``seed``, the
    device, CUDA graphs off on the CPU, local assets, final observations kept, and a time limit
    longer than ``episode_steps``."""
    assets = LOCAL_ASSETS.get(gym_id)
    if assets is None:
        raise IsaacLabTaskError(
            f"Isaac Lab task {gym_id!r} has no local assets (its stock ones are on a remote "
            f"bucket); add it to LOCAL_ASSETS; tasks with local assets: "
            f"{', '.join(sorted(LOCAL_ASSETS))}"
        )
    cfg = _env_cfg(gym_id)
    cfg.scene.num_envs = num_worlds
    cfg.seed = seed
    cfg.sim.device = device
    if device == "cpu":
        cfg.sim.physics.use_cuda_graph = False
    step_dt = cfg.sim.dt * cfg.decimation
    cfg.episode_length_s = (episode_steps + 2) * step_dt
    cfg.compute_final_obs = True
    for asset in assets.replace:
        _set_path(cfg, asset.field, _local_usd(asset))
    for dotted in assets.drop:
        _set_path(cfg, dotted, None)
    return cfg


def _checked_scene(scene: Scene, gym_id: str | None) -> tuple[str, SuccessConfig]:
    """The Isaac Lab id a scene runs (``gym_id``, else its task's part after ``isaaclab:``)
    and its success predicate, refusing what Isaac Lab tasks cannot run."""
    config = scene.config
    if gym_id is None:
        prefix, sep, gym_id = config.task.partition(":")
        if not sep or prefix != PREFIX:
            raise ValueError(f"scene {scene.path} has task {config.task!r}, not an "
                             f"{PREFIX}:<gym id> task")
    rule = config.success
    if rule is None:
        raise ValueError(f"scene {scene.path} names no success predicate")
    if rule.info is not None:
        raise PhysaiError(f"{config.task}: the success predicate {{info: {rule.info}}} is "
                          "not supported for Isaac Lab tasks; use {survive: true} or "
                          "{min_return: X}")
    return gym_id, rule


class IsaacLabTaskEnv(VectorEpisodes):
    """N worlds of an Isaac Lab direct-workflow task as a
    :class:`~stages.sim.env.batched.BatchedEnv`.

    Actions in [-1, 1] go to Isaac Lab's env unchanged, so its own scaling applies (cartpole:
    an action of 1.0 is ``action_scale`` = 100 N on the cart). Every episode lasts the scene's
    ``episode_steps``; a world whose env terminates earlier keeps its final observation and
    return until the others are done (Isaac Lab restarts it inside its step; the adapter ignores
    that world until :meth:`reset` or :meth:`respawn`; the episode logic is
    :class:`~stages.sim.env.vector_env.VectorEpisodes`). ``step(..., restart_fallen=True)`` keeps
    Isaac Lab's restart instead, and :attr:`restarted` says which worlds it restarted.

    Isaac Lab seeds torch, NumPy, ``random`` and Warp globally with ``seed`` when the env is
    built; later resets continue those generators. Only one Isaac Lab env may live in a process
    (its simulation context is a singleton): building one clears a context left behind, and
    :meth:`close` frees it for the next.
    """

    _action_dtype: ClassVar[type] = np.float32
    """Isaac Lab's envs take float32 actions."""

    _family: ClassVar[str] = "an Isaac Lab task"

    def __init__(
        self,
        scene: Scene,
        num_worlds: int,
        seed: int,
        *,
        num_threads: int | None = None,
        device: str = "auto",
        gym_id: str | None = None,
    ) -> None:
        """Build ``num_worlds`` worlds of the scene's Isaac Lab task; call reset() next.

        Args:
            scene: A scene of task ``isaaclab:<gym id>`` with a ``survive`` or ``min_return``
                success predicate.
            num_worlds: Worlds N stepped together (>= 1).
            seed: Isaac Lab's seed (``env_cfg.seed``).
            num_threads: Accepted for the factory signature; Warp's CPU kernels run on one
                thread.
            device: ``auto``, ``cpu`` or ``cuda`` (:func:`sim_device`).
            gym_id: The Isaac Lab id; default: the part of the scene's task after ``isaaclab:``.
        """
        config = scene.config
        self._start_worlds(scene, config.task, num_worlds)
        gym_id, rule = _checked_scene(scene, gym_id)
        gym = _isaaclab_tasks()
        import torch
        from isaaclab.sim import SimulationContext

        cache = os.environ.get(WARP_CACHE_ENV)
        if cache:
            import warp

            warp.config.kernel_cache_dir = cache
        self._torch = torch
        self._task = config.task
        self._gym_id = resolve_gym_id(gym_id)
        self._device = sim_device(device)
        cfg = _build_cfg(self._gym_id, num_worlds, seed, self._device, config.episode_steps)
        SimulationContext.clear_instance()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                self._gym_env = gym.make(self._gym_id, cfg=cfg)
        except Exception as exc:
            SimulationContext.clear_instance()
            raise IsaacLabTaskError(f"Isaac Lab task {self._gym_id!r} cannot be built: "
                                    f"{_first_line(exc)}") from exc
        self._env: Any = self._gym_env.unwrapped
        self._closed = False
        if self._env.max_episode_length <= self._episode_steps:
            self.close()
            raise RuntimeError(f"Isaac Lab's time limit {self._env.max_episode_length} does not "
                               f"exceed episode_steps {self._episode_steps}")
        obs_space, act_space = _spaces(cfg)
        from gymnasium import spaces

        self._noisy = cfg.observation_noise_model is not None
        self._start_vector(spaces.flatdim(obs_space), spaces.flatdim(act_space), rule)
        self._all = torch.arange(num_worlds, dtype=torch.int32, device=self._device)

    def _vector_reset(self) -> np.ndarray:
        """Isaac Lab's reset of every world (it draws the initial states).
        Shape: (num_worlds, obs_dim), float32."""
        obs, _ = self._gym_env.reset()
        return self._policy_obs(obs)

    def _vector_step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Isaac Lab's step with the actions as they are (its own action scaling applies). It
        restarts the worlds whose env ended within the step: their observation is the fresh
        one, and ``final_obs`` (computed only when some world ended) the one where they
        ended."""
        obs_t, reward_t, terminated_t, truncated_t, extras = self._gym_env.step(
            self._torch.from_numpy(actions))
        terminated = terminated_t.cpu().numpy()
        truncated = truncated_t.cpu().numpy()
        final = (self._policy_obs(extras["final_obs"]) if (terminated | truncated).any()
                 else None)
        return (self._policy_obs(obs_t), reward_t.cpu().numpy().astype(np.float64), terminated,
                truncated, final)

    def _reset_worlds(self, mask: np.ndarray) -> np.ndarray:
        """Isaac Lab's own reset of the worlds of ``mask``; the others continue."""
        env = self._env
        env._reset_idx(self._all[self._torch.as_tensor(np.flatnonzero(mask))])
        env.scene.write_data_to_sim()
        env.sim.forward()
        return self._policy_obs(env._compute_observations())

    def _restart_ended(self, mask: np.ndarray) -> None:
        """Isaac Lab's step has restarted the worlds of ``mask`` already (the step's
        observation is their fresh one): only their episode statistics are cleared."""
        self._clear(mask)

    def _clean_observation(self) -> np.ndarray:
        """The current observation; an error for a task whose config adds observation noise.

        Returns:
            Shape: (num_worlds, obs_dim), float32.
        """
        if self._noisy:
            raise PhysaiError(f"{self._task}: Isaac Lab adds observation noise to this task; its "
                              "noise-free observation is not available")
        return super()._clean_observation()

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Not available: Isaac Lab's kit-less mode has no offscreen renderer here.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"{self._task}: Isaac Lab's kit-less mode has no renderer here")

    def close(self) -> None:
        """Close Isaac Lab's env and its simulation context, so another env can be built."""
        if not self._closed:
            self._closed = True
            self._gym_env.close()

    def _policy_obs(self, obs: dict[str, Any]) -> np.ndarray:
        """The policy group of Isaac Lab's observation as float32. Shape: (N, obs_dim)."""
        return obs[OBS_GROUP].detach().cpu().numpy().reshape(self._num_worlds, self._obs_dim) \
            .astype(np.float32, copy=False)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout, by Python or by C code on fd 1, to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    """``describe GYM_ID``: print :func:`describe` as one JSON line on stdout; everything
    Isaac Lab prints goes to stderr. A bad id prints one ``error:`` line and returns 2."""
    parser = argparse.ArgumentParser(prog="python -m stages.sim.backends.isaaclab_tasks",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("describe", help="facts about an Isaac Lab task, as one JSON line")
    cmd.add_argument("gym_id", help="Isaac Lab id, e.g. Isaac-Cartpole-Direct-v0")
    args = parser.parse_args(argv)
    try:
        with _stdout_to_stderr():
            facts = describe(args.gym_id)
    except PhysaiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(facts, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
