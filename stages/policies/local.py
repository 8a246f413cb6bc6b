"""Policies: this project's MLP with the observation normalizer inside, and ONNX policies.

A policy trained here is an ``.npz`` file (one array per parameter and a JSON ``__meta__``
entry): byte-identical for identical weights, so its digest is reproducible, and loaded with
``allow_pickle=False``. Its metadata's ``kind`` says which network it holds: the state MLP
(no ``kind``) or a policy that sees (``"vision"``, :mod:`stages.policies.vision`). A policy trained
elsewhere (:mod:`stages.training.imported`) is stored as an ONNX graph ``obs`` (batch, obs_dim) ->
``actions`` (batch, act_dim), or, for one that sees, with a uint8 (batch, H, W, 3) input per
camera image beside ``obs``. Both are data: loading either runs no code from the file.
:func:`load_actor` runs any of them.
"""

from __future__ import annotations

import contextlib
import json
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from edge.runtime import ActionChunks
from physai_core.errors import ConfigError, PhysaiError
from stages.sim.env.observation import STATE_KEY

if TYPE_CHECKING:
    import torch
    from torch import nn


PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A policy as a numpy function. Shape: obs (N, obs_dim) float32 -> actions (N, act_dim).
A policy that sees (:class:`SeeingPolicy`) takes the mapping of its named inputs instead."""

PolicyFormat = Literal["npz", "onnx"]
"""How a stored policy is written: this project's network (``npz``) or an ONNX graph."""


@dataclass(frozen=True)
class ChunkPolicy:
    """A state policy that emits chunks: ``act(obs (N, obs_dim)) -> (N, chunk_size, act_dim)``
    float32, the next ``chunk_size`` actions from now (:class:`edge.runtime.ActionChunks`
    turns them into one action a step)."""

    chunk_size: int
    run: Callable[[np.ndarray], np.ndarray]
    chunk_how: Mapping[str, float] | None = None
    """How its maker runs its chunks (:data:`CHUNK_METADATA`), unless validation says."""

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """The chunk of every observation. Shape: (N, obs_dim) -> (N, chunk_size, act_dim)."""
        return self.run(obs)


@dataclass(frozen=True)
class SeeingPolicy:
    """A policy that reads named tensors: ``act({"obs": ..., "<camera>_image": ...}) ->
    actions`` (N, act_dim) float32 (:mod:`stages.sim.env.observation`).

    Shapes: ``obs`` (N, obs_dim) float32; each image (N, H, W, 3) uint8.
    """

    inputs: tuple[str, ...]
    """The tensors it reads, the state first: e.g. ``("obs", "front_image")``."""
    run: Callable[[Sequence[np.ndarray]], np.ndarray]
    """The network on the tensors in :attr:`inputs` order."""
    chunk_size: int | None = None
    """k for a policy that emits chunks of k actions, (N, k, act_dim); None: one action."""
    chunk_how: Mapping[str, float] | None = None
    """How its maker runs its chunks (:data:`CHUNK_METADATA`), unless validation says."""

    def __call__(self, observation: Any) -> np.ndarray:
        """Actions for ``observation``, a mapping holding every tensor of :attr:`inputs`.

        Raises :class:`~physai_core.errors.PhysaiError` (one line) for a missing tensor or an image
        that is not uint8.
        """
        if isinstance(observation, np.ndarray):
            raise PhysaiError(f"the policy reads {', '.join(self.inputs)}, not one array")
        missing = [name for name in self.inputs if name not in observation]
        if missing:
            raise PhysaiError(f"the policy reads {', '.join(self.inputs)}; the observation "
                              f"lacks {', '.join(missing)}")
        arrays = [np.ascontiguousarray(observation[STATE_KEY], dtype=np.float32)]
        for name in self.inputs[1:]:
            image = np.ascontiguousarray(observation[name])
            if image.dtype != np.uint8:
                raise PhysaiError(f"image {name!r} must be uint8 (value: {image.dtype})")
            arrays.append(image)
        return self.run(arrays)


class DiffusionActor:
    """A diffusion policy (an ONNX graph with ``physai.diffusion`` metadata) as a policy that
    emits chunks of ``n_action_steps`` actions: ``act(observation) -> (N, k, act_dim)``, its
    history of observations, noise and schedule kept by :class:`edge.runtime.DiffusionSampler`.

    It must see every step's observation: a :class:`ChunkRunner` calls it when a chunk is
    due and :meth:`observe` on the other steps, and :meth:`forget` as worlds start again.
    ``observation`` is the mapping of :attr:`inputs` (``obs`` (N, obs_dim) float32, each image
    (N, H, W, 3) uint8), or the state alone for a policy that reads nothing else.
    """

    def __init__(self, session: Any, steps: int | None = None) -> None:
        self.sampler = session.sampler(steps)
        self.inputs: tuple[str, ...] = tuple(session.inputs)
        self.chunk_size = self.sampler.chunk_size

    def _arrays(self, observation: Any) -> dict[str, np.ndarray]:
        """The tensors of ``observation`` by name, checked (as :class:`SeeingPolicy`)."""
        if not isinstance(observation, Mapping):
            observation = {STATE_KEY: observation}
        missing = [name for name in self.inputs if name not in observation]
        if missing:
            raise PhysaiError(f"the policy reads {', '.join(self.inputs)}; the observation "
                              f"lacks {', '.join(missing)}")
        arrays = {STATE_KEY: np.ascontiguousarray(observation[STATE_KEY], dtype=np.float32)}
        for name in self.inputs[1:]:
            image = np.ascontiguousarray(observation[name])
            if image.dtype != np.uint8:
                raise PhysaiError(f"image {name!r} must be uint8 (value: {image.dtype})")
            arrays[name] = image
        return arrays

    def __call__(self, observation: Any) -> np.ndarray:
        """This step's observation kept, then a chunk for every world.
        Shape: -> (N, n_action_steps, act_dim) float32."""
        return self.sampler(self._arrays(observation))

    def observe(self, observation: Any) -> None:
        """This step's observation kept, on a step that acts from a chunk already given."""
        self.sampler.observe(self._arrays(observation))

    def forget(self, worlds: np.ndarray | None = None) -> None:
        """Forget the history of ``worlds`` (a bool mask or indices; None: all)."""
        self.sampler.reset(worlds)

    def reset(self) -> None:
        """Forget every world's history."""
        self.sampler.reset()


OUTPUTS = ("tanh", "clip")
"""How a policy bounds its actions to [-1, 1]: a tanh layer (behaviour cloning) or clipping of
a linear output (PPO's Gaussian mean, which the simulator clips the same way)."""


def build_policy(
    obs_dim: int,
    act_dim: int,
    hidden: tuple[int, ...],
    mean: np.ndarray,
    std: np.ndarray,
    output: str = "tanh",
    chunk_size: int = 1,
) -> nn.Module:
    """An MLP ``obs -> actions`` whose first op normalizes with ``mean`` and ``std``.

    Hidden layers use ELU; ``output`` (one of :data:`OUTPUTS`) bounds the last layer.
    Shape: obs (batch, obs_dim) float32 -> actions (batch, act_dim) float32 in [-1, 1]; with
    ``chunk_size`` k above 1, a chunk of the next k actions (batch, k, act_dim)
    (:func:`with_chunks`).
    """
    if chunk_size > 1:
        flat = build_policy(obs_dim, act_dim * chunk_size, hidden, mean, std, output)
        return with_chunks(flat, chunk_size, act_dim)
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    import torch
    from torch import nn

    from stages.policies.vision import elu_mlp

    class NormalizedMLP(nn.Module):
        """MLP with fixed observation normalization and a bounded output."""

        def __init__(self) -> None:
            super().__init__()
            self.obs_mean: torch.Tensor
            self.obs_std: torch.Tensor
            self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float32))
            self.net = elu_mlp(obs_dim, hidden, act_dim, tanh=output == "tanh")

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net((obs - self.obs_mean) / self.obs_std)
            if output == "clip":
                out = out.clamp(-1.0, 1.0)
            return out

    return NormalizedMLP()


def with_chunks(module: nn.Module, chunk_size: int, act_dim: int) -> nn.Module:
    """``module``, whose ``net`` (an ``nn.Sequential``) ends in ``chunk_size * act_dim``
    outputs, made to emit chunks: a parameterless ``Unflatten`` closes ``net``, so the state
    dict's keys stay the flat network's. Sets ``module.chunk_size`` and ``module.act_dim``.
    Shape: -> (batch, chunk_size, act_dim)."""
    from torch import nn

    net = module.net
    if not isinstance(net, nn.Sequential):
        raise TypeError(f"a chunk head closes an nn.Sequential, not a {type(net).__name__}")
    net.append(nn.Unflatten(1, (chunk_size, act_dim)))
    object.__setattr__(module, "chunk_size", chunk_size)
    object.__setattr__(module, "act_dim", act_dim)
    return module


def chunk_size_of(module_or_act: Any) -> int | None:
    """The chunk size k of a policy that emits chunks of actions (a module or a callable with
    a ``chunk_size``), else None: one action a step."""
    size = getattr(module_or_act, "chunk_size", None)
    return int(size) if size is not None else None


def chunk_targets(actions: np.ndarray, episode_index: np.ndarray, chunk_size: int
                  ) -> np.ndarray:
    """The demonstration's next ``chunk_size`` actions at every row: row i's chunk is the
    actions of rows i, i+1, ... of its episode, the episode's last action repeated past its
    end. Rows of an episode are consecutive, in time order
    (:class:`stages.datasets.demonstrations.Transitions`). Shape: actions (N, act_dim),
    episode_index (N,) -> (N, chunk_size, act_dim)."""
    rows = np.arange(len(actions))
    starts = np.flatnonzero(np.r_[True, episode_index[1:] != episode_index[:-1]])
    ends = np.r_[starts[1:], len(actions)] - 1
    last = np.repeat(ends, np.diff(np.r_[starts, len(actions)]))
    index = np.minimum(rows[:, None] + np.arange(chunk_size)[None, :], last[:, None])
    return np.ascontiguousarray(actions[index])


class ChunkRunner:
    """A policy that emits chunks of actions, run one action a step for a batch of worlds by
    :class:`edge.runtime.ActionChunks` (``how``: ``{"execute": n}`` or ``{"ensemble": m}``).

    Called like a policy of one action a step, ``(observation) -> (N, act_dim)`` float32: the
    wrapped policy is queried (all N worlds, (N, k, act_dim)) only on steps that need a new
    chunk, and each query is counted and timed. :meth:`reset` forgets the chunks of worlds
    whose episode starts again. A new world count (a new batch of worlds) starts afresh. Every
    other attribute (``inputs``, ``failures``, ``close``) is the wrapped policy's own; it has
    no ``chunk_size``, as its calls give one action a step.
    """

    def __init__(self, act: Any, chunk_size: int, how: Mapping[str, float]) -> None:
        self.act = act
        self.size = int(chunk_size)
        self.how = dict(how)
        self.spec: dict[str, Any] = ActionChunks(self.size, **self.how).spec()  # type: ignore[arg-type]
        """What a manifest's ``io.chunk`` records of this way of running chunks."""
        self.chunks: ActionChunks | None = None
        self.query_ns: list[int] = []
        """Nanoseconds of every query of the wrapped policy, in order."""

    @property
    def queries(self) -> int:
        """Calls of the wrapped policy so far."""
        return len(self.query_ns)

    def __call__(self, observation: Any) -> np.ndarray:
        """This step's action of every world. Shape: -> (N, act_dim) float32."""
        state = observation[STATE_KEY] if isinstance(observation, Mapping) else observation
        worlds = len(state)
        if self.chunks is None or self.chunks.worlds != worlds:
            self.chunks = ActionChunks(self.size, worlds=worlds, **self.how)  # type: ignore[arg-type]
        chunk = None
        if self.chunks.due():
            start = time.perf_counter_ns()
            chunk = np.asarray(self.act(observation))
            self.query_ns.append(time.perf_counter_ns() - start)
        elif isinstance(self.act, DiffusionActor):  # its history takes every step
            self.act.observe(observation)
        return self.chunks.step(chunk)

    def reset(self, worlds: np.ndarray | None = None) -> None:
        """Forget the chunks of ``worlds`` (a bool mask or indices; None: every world, and the
        wrapped policy's own ``reset`` runs too), and a diffusion policy's history of them."""
        if self.chunks is not None:
            self.chunks.reset(worlds)
        if isinstance(self.act, DiffusionActor):
            self.act.forget(worlds)
        inner = getattr(self.act, "reset", None)
        if worlds is None and callable(inner):
            inner()

    def __getattr__(self, name: str) -> Any:
        if name == "chunk_size" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["act"], name)


def run_chunks(act: Any, how: Mapping[str, float] | None, field: str = "validate.chunk",
               where: str = "policy") -> Any:
    """``act`` as a policy of one action a step: a policy that emits chunks of k actions
    wrapped in a :class:`ChunkRunner` running them ``how`` says (None: all k of each chunk,
    ``{"execute": k}``); any other policy as it is. A runner is returned as it is.

    Raises :class:`~physai_core.errors.ConfigError` (one line naming ``where``, the config file or
    the policy, and ``field``) for a chunk setting given to a policy of one action a step, or
    an ``execute`` above the chunk size.
    """
    if isinstance(act, ChunkRunner):
        return act
    size = chunk_size_of(act)
    if size is None:
        if how is not None:
            raise ConfigError.one(where, field, dict(how), "the policy gives one action a "
                                  "step, not chunks of actions: remove the chunk setting")
        return act
    declared = getattr(act, "chunk_how", None)
    how = dict(how) if how is not None else dict(declared or {"execute": size})
    if how.get("execute", 1) > size:
        raise ConfigError.one(where, field, how, f"execute must be at most the policy's "
                              f"chunk size {size}")
    return ChunkRunner(act, size, how)


META_KEY = "__meta__"


def save_policy(module: nn.Module, path: Path, meta: dict[str, Any]) -> None:
    """Save weights and architecture metadata as npz: ``obs_dim``, ``act_dim``, ``hidden`` and,
    for a clipped output, ``output``; for a policy that sees,
    :func:`stages.policies.vision.vision_meta` (``kind`` ``"vision"``, ``cameras``,
    ``encoder_channels``); for a policy that emits chunks of actions, ``chunk_size`` (absent: one
    action a step)."""
    arrays = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    arrays[META_KEY] = np.array(json.dumps(meta, sort_keys=True))
    write_npz(path, arrays)


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as an ``.npz`` that ``np.load`` reads, the same bytes on every Python.

    Written here rather than by ``np.savez``: numpy forces ZIP64 on each member, and how
    ``zipfile`` records that changed within Python 3.11 (its version fields read 20 on Debian's
    3.11.2, 45 on 3.11.7), so the same weights made two policy digests in the project's
    container and in its venv. Each member here is one ``.npy`` (numpy's own format writer),
    stored, with fixed headers, without ZIP64 (a member past 2 GiB is refused)."""
    import io

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=False) as archive:
        for name, value in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(value), allow_pickle=False)
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            member.external_attr = 0o600 << 16
            archive.writestr(member, buffer.getvalue())


def load_policy(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a policy saved by :func:`save_policy`; no pickle is ever executed."""
    import torch

    try:
        with np.load(path, allow_pickle=False) as blob:
            arrays = {k: blob[k] for k in blob.files}
        meta = json.loads(str(arrays.pop(META_KEY)))
        module = _network(meta, arrays["obs_mean"], arrays["obs_std"])
        module.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, zipfile.BadZipFile) as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    module.eval()
    return module, meta


def _network(meta: dict[str, Any], mean: np.ndarray, std: np.ndarray) -> nn.Module:
    """The untrained network ``meta`` describes (by its ``kind``), normalizing with ``mean``
    and ``std``. Raises KeyError, TypeError or ValueError for metadata that describes none."""
    kind = meta.get("kind")
    chunk = int(meta.get("chunk_size", 1))
    if chunk < 1:
        raise ValueError(f"chunk_size must be at least 1 (value: {chunk})")
    if kind == "vision":
        from stages.policies.vision import vision_from_meta

        if chunk == 1:
            return vision_from_meta(meta, mean, std)
        act_dim = int(meta["act_dim"])
        flat = vision_from_meta({**meta, "act_dim": act_dim * chunk}, mean, std)
        return with_chunks(flat, chunk, act_dim)
    if kind is not None:
        raise ValueError(f"unknown policy kind {kind!r}")
    return build_policy(int(meta["obs_dim"]), int(meta["act_dim"]),
                        tuple(int(h) for h in meta["hidden"]), mean, std,
                        str(meta.get("output", "tanh")), chunk)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Run the block on one torch thread, without autograd; the thread count is restored."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)


def policy_fn(module: nn.Module) -> Any:
    """Wrap ``module`` as a numpy function ``obs (N, obs_dim) -> actions (N, act_dim)``; a
    module that sees (an ``inputs`` attribute beyond ``obs``, :mod:`stages.policies.vision`) as a
    :class:`SeeingPolicy` of the mapping of those tensors; a module that emits chunks (a
    ``chunk_size`` above 1) returns (N, k, act_dim) and carries ``chunk_size``.

    Runs on one torch thread: the simulator's stepping threads own the other cores, and torch's
    spinning worker threads next to them slow a rollout several times over.
    """
    import torch

    inputs = tuple(getattr(module, "inputs", None) or (STATE_KEY,))
    chunk = chunk_size_of(module)
    if inputs != (STATE_KEY,):

        def run(arrays: Sequence[np.ndarray]) -> np.ndarray:
            with _one_torch_thread():
                out: torch.Tensor = module(*(torch.from_numpy(a) for a in arrays))
            return out.numpy()

        return SeeingPolicy(inputs, run, chunk)

    def act(obs: np.ndarray) -> np.ndarray:
        with _one_torch_thread():
            out: torch.Tensor = module(torch.from_numpy(np.asarray(obs, dtype=np.float32)))
        return out.numpy()

    return act if chunk is None else ChunkPolicy(chunk, act)


_ZIP_MAGIC = b"PK\x03\x04"


def policy_format(path: Path) -> PolicyFormat:
    """Whether the policy file at ``path`` is an ``.npz`` MLP (a zip archive) or ONNX."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "npz" if head == _ZIP_MAGIC else "onnx"


def stored_chunk_size(path: Path) -> int | None:
    """The chunk size k of the stored policy at ``path`` when it emits chunks of actions
    (an npz's ``chunk_size``, an ONNX graph's (batch, k, act_dim) output), else None; the
    network is not built."""
    if policy_format(path) == "onnx":
        from edge.session import open_session

        return open_session(path, threads=1).chunk_size
    with np.load(path, allow_pickle=False) as blob:
        size = json.loads(str(blob[META_KEY])).get("chunk_size")
    return int(size) if size is not None else None


def load_actor(path: Path, steps: int | None = None) -> PolicyFn:
    """Any stored policy as ``obs (N, obs_dim) -> actions (N, act_dim)`` (numpy, float32); one
    that sees as a :class:`SeeingPolicy` of its named inputs; one that emits chunks of k
    actions returns (N, k, act_dim) and has ``chunk_size`` k (:class:`ChunkPolicy`); a
    diffusion policy is a :class:`DiffusionActor` sampling ``steps`` denoising steps (default:
    its own).

    An ``.npz`` MLP runs in torch (:func:`policy_fn`), an ONNX graph in ONNX Runtime on the CPU
    with one thread. Neither runs code from the file; a file that is neither is a one-line
    :class:`~physai_core.errors.ConfigError`.
    """
    if policy_format(path) == "npz":
        return policy_fn(load_policy(path)[0])
    return onnx_actor(path, steps)


def onnx_actor(path: Path, steps: int | None = None) -> PolicyFn:
    """An ONNX policy ``obs`` -> ``actions`` run by ONNX Runtime (CPU, one thread, sequential);
    a graph that also reads camera images (uint8 (batch, H, W, 3) inputs) as a
    :class:`SeeingPolicy` whose ``inputs`` are ``obs`` and the graph's image inputs.

    A graph whose batch dimension is fixed (Isaac Lab exports batch 1) is run one observation
    at a time. Shape: obs (N, obs_dim) -> actions (N, act_dim), float32; a graph whose output
    is a chunk of k actions, (batch, k, act_dim), gives (N, k, act_dim) and has ``chunk_size``.
    A diffusion graph is a :class:`DiffusionActor` sampling ``steps`` denoising steps (default:
    its own).
    """
    from edge.errors import EdgeError
    from edge.session import OUTPUT_NAME, open_session

    try:
        policy = open_session(path, threads=1)
        if policy.diffusion is not None:
            return DiffusionActor(policy, steps)
    except EdgeError as exc:
        raise ConfigError.one(path, "", path.name, f"not a policy file: {exc}") from None
    how = declared_chunking(path, policy.session, policy.chunk_size)
    fixed = policy.session.get_inputs()[0].shape[0]
    rows = fixed if isinstance(fixed, int) else None
    session = policy.session
    names = policy.inputs

    def run(arrays: Sequence[np.ndarray]) -> np.ndarray:
        feed = dict(zip(names, arrays, strict=True))
        if rows is None or len(arrays[0]) == rows:
            out: np.ndarray = session.run([OUTPUT_NAME], feed)[0]
            return out
        parts = [session.run([OUTPUT_NAME], {k: v[i : i + rows] for k, v in feed.items()})[0]
                 for i in range(0, len(arrays[0]), rows)]
        return np.concatenate(parts)

    if policy.images:
        return SeeingPolicy(names, run, policy.chunk_size, how)

    def act(obs: np.ndarray) -> np.ndarray:
        return run([np.ascontiguousarray(obs, dtype=np.float32)])

    return act if policy.chunk_size is None else ChunkPolicy(policy.chunk_size, act, how)


CHUNK_METADATA = "physai.chunk"
"""ONNX metadata of a chunk policy saying how its maker runs its chunks, as
:meth:`edge.runtime.ActionChunks.spec` does without the size: ``{"execute": n}`` (LeRobot's
``n_action_steps``) or ``{"ensemble": m}`` (its ``temporal_ensemble_coeff``). Validation and
packaging run the chunks so unless ``validate.chunk`` says otherwise."""


def declared_chunking(path: Path, session: Any, size: int | None) -> dict[str, float] | None:
    """The graph's :data:`CHUNK_METADATA`, checked against its chunk ``size``; None without
    it. A malformed one is a one-line ConfigError naming ``path``."""
    text = session.get_modelmeta().custom_metadata_map.get(CHUNK_METADATA)
    if text is None or size is None:
        return None
    try:
        how = json.loads(text)
    except ValueError:
        how = None
    ok = isinstance(how, dict) and len(how) == 1 and (
        (type(how.get("execute")) is int and 1 <= how["execute"] <= size)
        or (type(how.get("ensemble")) in (int, float) and 0 <= how["ensemble"] < 1e6))
    if not ok:
        raise ConfigError.one(path, CHUNK_METADATA, text[:80], "must be {\"execute\": N} "
                              f"(1 to the chunk size {size}) or {{\"ensemble\": M}} (M >= 0)")
    return {k: float(v) if k == "ensemble" else int(v) for k, v in how.items()}
