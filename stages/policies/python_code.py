"""Experts and policies given as Python code: ``python:PACKAGE.MODULE:CALLABLE``.

A benchmark's scripted policy (MetaWorld's ``metaworld.policies:SawyerPickPlaceV3Policy``), a
phase controller a team wrote, or a classical controller acts as the expert of collect and DAgger
(``collect: {expert: python:..., trust_code: true}``) and is judged by ``flows validate`` /
``flows compare`` like any policy (``--trust-code``). Importing a module runs its code, so a
reference is refused unless the config says ``trust_code: true`` or the command line
``--trust-code``.

``CALLABLE`` is resolved in the interpreter that simulates (a benchmark's stage environment,
where its package is installed) and makes one controller per world:

- a class, or a function whose parameters all have defaults (or that takes ``make_kwargs``),
  is a factory: it is called once per world at the start of every episode, so a stateful
  controller (a phase machine, a filter) starts each episode and each world afresh. A factory
  that takes a parameter ``make_kwargs`` is given the scene's Gymnasium make kwargs (which of
  MetaWorld's tasks the scene is, ``{"env_name": "pick-place-v3"}``);
- any other callable of one parameter is a stateless controller itself.

A controller is an object with ``get_action(obs)`` (MetaWorld's policies) or a callable
``controller(obs)``; it takes one world's observation as the task gives it (shape (obs_dim,),
float64: a Gymnasium task's observation flattened in its space's order) and returns that
world's action in the task's native units (the environment's action Box for a ``gymnasium:``
task), which are converted to the pipeline's -1..1 and clipped.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from physai_core.errors import ConfigError, PhysaiError
from stages.core.code_refs import REF_HELP, REF_PATTERN, ref_problem
from stages.core.units import ActionRange
from stages.sim.env.capabilities import MadeWithKwargs, capabilities_of


def untrusted(file: object, field: str, ref: str, flag: str) -> ConfigError:
    """The one-line refusal of a Python reference that was not admitted with ``flag``."""
    return ConfigError.one(str(file), field, ref,
                           f"is Python code, which runs when it is imported; admit it with {flag}")


def resolve_callable(ref: str, file: object, field: str) -> Callable[..., Any]:
    """The object ``ref`` (``python:PACKAGE.MODULE:ATTR``) names, imported; a bad form, a module
    that does not import or a missing attribute is a one-line ConfigError naming ``file`` and
    ``field`` (exit status 2)."""
    problem = ref_problem(ref)
    match = REF_PATTERN.fullmatch(ref)
    if problem is not None or match is None:
        raise ConfigError.one(str(file), field, ref, problem or f"is not {REF_HELP}")
    module_name, attr = match.groups()
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError.one(str(file), field, ref, f"module {module_name!r} does not import "
                              f"here ({type(exc).__name__}: {first[:200]})") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ConfigError.one(str(file), field, ref,
                                  f"module {module_name!r} has no attribute {attr!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError.one(str(file), field, ref, f"{attr} is a {type(found).__name__}, "
                              "not a class, factory or controller")
    return found


def _is_factory(target: Callable[..., Any]) -> bool:
    """Whether ``target`` makes controllers (a class, or a function callable without its
    observation) rather than being one."""
    if inspect.isclass(target):
        return True
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name != "make_kwargs"]
    return not required


def _takes_make_kwargs(factory: Callable[..., Any]) -> bool:
    try:
        return "make_kwargs" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


class PythonPolicy:
    """A Python controller per world, run as a batched policy: ``(obs (N, obs_dim)) ->
    actions (N, act_dim)`` float32 in -1..1.

    The reference is imported on first use (:meth:`resolve`), in the process that simulates:
    a suite whose backend lives in a stage environment imports it there, not here.
    :meth:`start_episode` (validation and recording call it as each episode starts) makes each
    world's controller afresh from the factory, given the environment's make kwargs; a
    stateless controller is shared by every world.
    """

    def __init__(self, ref: str, actions: ActionRange, file: object, field: str) -> None:
        self.ref = ref
        self._where = (file, field)
        self._target: Callable[..., Any] | None = None
        self._factory = self._make_kwargs = False
        self._actions = actions
        self._controllers: list[Any] | None = None
        self._context: dict[str, Any] = {}

    def resolve(self) -> Callable[..., Any]:
        """The callable the reference names, imported once (one-line ConfigError if not)."""
        if self._target is None:
            target = resolve_callable(self.ref, *self._where)
            self._factory = _is_factory(target)
            self._make_kwargs = self._factory and _takes_make_kwargs(target)
            self._target = target
        return self._target

    def start_episode(self, env: object) -> None:
        """Forget every world's controller: the next call makes them afresh, with the make
        kwargs of ``env`` (its scene's, where it has any)."""
        given = cast(MadeWithKwargs, env).make_kwargs \
            if capabilities_of(env).make_kwargs else {}
        self._context = dict(given)
        self._controllers = None

    def reset(self) -> None:
        """Forget every world's controller (a new episode, the make kwargs kept)."""
        self._controllers = None

    def _make(self, worlds: int) -> list[Any]:
        target = self.resolve()
        if not self._factory:
            return [target] * worlds
        kwargs = {"make_kwargs": dict(self._context)} if self._make_kwargs else {}
        try:
            return [target(**kwargs) for _ in range(worlds)]
        except Exception as exc:
            raise PhysaiError(f"{self.ref}: making a controller failed "
                              f"({type(exc).__name__}: {exc})") from exc

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Every world's action from its own controller. Shape: (N, obs_dim) -> (N, act_dim)."""
        batch = np.asarray(obs, np.float64)
        if self._controllers is None or len(self._controllers) != len(batch):
            self._controllers = self._make(len(batch))
        out = np.empty((len(batch), self._actions.act_dim), np.float64)
        for i, (controller, row) in enumerate(zip(self._controllers, batch, strict=True)):
            act = getattr(controller, "get_action", None)
            action = np.asarray(act(row) if callable(act) else controller(row), np.float64)
            if action.size != self._actions.act_dim or not np.isfinite(action).all():
                raise PhysaiError(f"{self.ref} returned action {action.tolist()!r} for world "
                                  f"{i}: want {self._actions.act_dim} finite numbers")
            out[i] = action.reshape(-1)
        return np.clip(self._actions.to_normalized(out), -1.0, 1.0).astype(np.float32)


def python_policy(ref: str, actions: ActionRange, file: object, field: str) -> PythonPolicy:
    """The controllers ``ref`` names as a batched policy acting in ``actions``' native units
    (:class:`PythonPolicy`), imported now; import problems name ``file`` and ``field``."""
    policy = PythonPolicy(ref, actions, file, field)
    policy.resolve()
    return policy
