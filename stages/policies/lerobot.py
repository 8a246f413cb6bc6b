"""Policies trained by LeRobot, brought in through ``train: {source: FOLDER}``.

LeRobot saves a trained policy as a folder (``pretrained_model/``: ``config.json``,
``model.safetensors``, ``policy_preprocessor.json`` and ``policy_postprocessor.json`` with
their normalization stats in ``.safetensors`` files); ``lerobot-train`` writes it under
``checkpoints/<step>/pretrained_model``, ``checkpoints/last`` naming the latest. A source that
is such a folder, a checkpoint folder or a training's output folder is read here.

Its ``config.json`` is checked against the task first, as data: the policy's type (ACT or
diffusion), its
features (``observation.state`` of the task's observation width, ``observation.images.<camera>``
(3, H, W) for cameras of the task by name and size, ``action`` of the task's action width), and
its processor files (every step named by LeRobot's registry, none by a class path to import).
Then the ``lerobot`` stage environment (``make lerobot``) loads it with LeRobot's own code and
exports it to ONNX with its pre- and post-processing inside the graph
(stages/policies/lerobot_export.py): ``obs`` float32 (batch, obs_dim) and ``<camera>_image`` uint8
(batch, H, W, 3) -> ``actions`` float32 (batch, chunk_size, act_dim), a chunk policy
(edge.runtime.ActionChunks).

A diffusion policy is exported as one graph whose denoising loop reads the scheduler's steps and
the noise as inputs (stages/policies/lerobot_diffusion_export.py): ``obs`` (batch, n_obs_steps,
obs_dim), ``<camera>_image`` (batch, n_obs_steps, H, W, 3), ``noise`` and ``schedule`` ->
``actions`` (batch, n_action_steps, act_dim), its sampling described in the graph's metadata
``physai.diffusion``. It runs through :class:`edge.runtime.DiffusionSampler` (history, seeded
noise, schedule) as a chunk policy executing ``n_action_steps`` of each chunk; its parity is with
``select_action`` fed the same noise.

Parity: LeRobot's ``select_action`` (through its processors, step by step from a reset, with the
policy's own ``n_action_steps`` queue or temporal ensembling) is the reference; the ONNX graph
driven by :class:`edge.runtime.ActionChunks` in the same mode must give the same actions on the
same observations within the import's ``parity_tolerance``, as must its first chunk.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge.errors import EdgeError
from edge.runtime import MAX_CHUNK_SIZE, MAX_DIFFUSION_STEPS, ActionChunks
from edge.session import PolicySession, open_session
from physai_core.errors import ConfigError, PhysaiError
from stages.core.environments import require_python
from stages.core.hashing import sha256_bytes
from stages.core.limits import MAX_POLICY_JSON_BYTES, MAX_PROBE_BYTES, gib
from stages.sim.env.observation import STATE_KEY

if TYPE_CHECKING:
    from stages.sim.env.cameras import CameraSpec
    from stages.sim.tasks.catalog import TaskSpec

log = logging.getLogger(__name__)

ENVIRONMENT = "lerobot"
"""The stage environment LeRobot's code runs in (stages/core/environments.py)."""
SCRIPT = Path(__file__).with_name("lerobot_export.py")
"""The script that environment runs to load and export a policy."""
SUPPORTED = ("act", "diffusion")
"""LeRobot policy types brought in (``config.json``'s ``type``)."""
STATE = "observation.state"
IMAGES = "observation.images."
ACTION = "action"
PROCESSORS = ("policy_preprocessor.json", "policy_postprocessor.json")
WORLDS = 2
"""Probe worlds stepped side by side in the parity check."""
EXPORT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class LeRobotFolder:
    """A LeRobot policy folder read as data and matched to a task."""

    path: Path
    """The ``pretrained_model`` folder."""
    policy_type: str
    """LeRobot's policy type (``act``)."""
    inputs: dict[str, str]
    """Each LeRobot input feature -> the graph input it becomes, state first."""
    images: dict[str, tuple[int, int, int]]
    """Graph image input -> one frame's (height, width, 3)."""
    chunk_size: int
    """Actions per query (k)."""
    n_action_steps: int
    """Actions LeRobot runs from a chunk before it queries again."""
    temporal_ensemble_coeff: float | None
    """ACT's temporal ensembling coefficient, or None when it runs a queue of n_action_steps."""
    digest: str
    """sha256 over the folder's files (names and contents)."""
    n_obs_steps: int = 1
    """Observations a query reads (a diffusion policy's history); 1 for ACT."""

    @property
    def chunk_spec(self) -> dict[str, Any]:
        """How LeRobot runs its chunks, as a manifest's ``io.chunk`` says it."""
        if self.temporal_ensemble_coeff is not None:
            return {"size": self.chunk_size, "ensemble": self.temporal_ensemble_coeff}
        return {"size": self.chunk_size, "execute": self.n_action_steps}


@dataclass(frozen=True)
class LeRobotExport:
    """A LeRobot policy as an ONNX chunk policy, with how closely it matches LeRobot."""

    onnx: bytes
    """``obs`` and image inputs -> ``actions`` (batch, chunk_size, act_dim)."""
    folder: LeRobotFolder
    parity_max_abs_diff: float
    """Largest |ONNX + ActionChunks - LeRobot select_action| over the probe steps."""
    chunk_max_abs_diff: float
    """Largest |ONNX chunk - LeRobot predict_action_chunk| at the first probe step."""
    steps: int
    """Probe steps per world compared."""
    report: dict[str, Any]
    """What the export script reported (versions, LeRobot's per-query latency)."""


def pretrained_folder(path: Path) -> Path | None:
    """The ``pretrained_model`` folder at or under ``path`` (itself, ``pretrained_model/``, or
    ``checkpoints/last/pretrained_model/`` of a ``lerobot-train`` output), or None."""
    for folder in (path, path / "pretrained_model",
                   path / "checkpoints" / "last" / "pretrained_model"):
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
    return None


def folder_digest(folder: Path) -> str:
    """sha256 of the sorted lines ``name sha256(contents)`` of the folder's files."""
    lines = [f"{p.name} {sha256_bytes(p.read_bytes())}\n"
             for p in sorted(folder.iterdir()) if p.is_file()]
    return sha256_bytes("".join(lines).encode())


def _json(path: Path, file: str | Path, field: str, value: object) -> dict[str, Any]:
    """The JSON object in ``path``; a missing, malformed or oversized file (over
    :data:`~stages.core.limits.MAX_POLICY_JSON_BYTES`, checked before it is read) is one line."""
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_JSON_BYTES:
            raise ConfigError.one(file, field, value, f"{path.name} of the LeRobot policy is "
                                  f"{gib(size)}, over the {gib(MAX_POLICY_JSON_BYTES)} read")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError.one(file, field, value, f"{path.name} of the LeRobot policy cannot be "
                              f"read: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(data, dict):
        raise ConfigError.one(file, field, value, f"{path.name} is not a JSON object")
    return data


def _shape(feature: object) -> tuple[int, ...]:
    """A config.json feature's shape, or () when it has none or one that is not a short list
    of whole numbers (then it matches no task's)."""
    shape = feature.get("shape") if isinstance(feature, dict) else None
    if not isinstance(shape, list) or len(shape) > 4 or \
            not all(type(n) is int for n in shape):
        return ()
    return tuple(shape)


def _whole(config: Mapping[str, Any], key: str, low: int, high: int, file: str | Path,
           field: str) -> int:
    """``config[key]``, a whole number within ``low .. high``; else one line naming it."""
    value = config.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ConfigError.one(file, field, f"{key} {value!r}", f"config.json of the LeRobot "
                              f"policy must give {key} as a whole number {low:,} .. {high:,}")
    return value


def _chunking(config: Mapping[str, Any], file: str | Path,
              field: str) -> tuple[int, int, float | None]:
    """The policy's ``chunk_size`` (1 .. :data:`edge.runtime.MAX_CHUNK_SIZE`),
    ``n_action_steps`` (1 .. chunk_size) and ``temporal_ensemble_coeff`` (None, or a finite
    number >= 0), each checked before it sizes anything."""
    chunk = _whole(config, "chunk_size", 1, MAX_CHUNK_SIZE, file, field)
    steps = _whole(config, "n_action_steps", 1, chunk, file, field)
    coeff = config.get("temporal_ensemble_coeff")
    if coeff is not None and (type(coeff) not in (int, float) or not 0 <= coeff < float("inf")):
        raise ConfigError.one(file, field, f"temporal_ensemble_coeff {coeff!r}", "config.json "
                              "of the LeRobot policy must give temporal_ensemble_coeff as null "
                              "or a finite number >= 0")
    return chunk, steps, None if coeff is None else float(coeff)


def _diffusion_chunking(config: Mapping[str, Any], file: str | Path,
                        field: str) -> tuple[int, int]:
    """A diffusion policy's ``n_obs_steps`` and ``n_action_steps`` (its chunk), checked with
    what its sampling needs (:func:`edge.runtime.diffusion_problem`'s ranges): a DDPM or DDIM
    scheduler predicting ``epsilon`` or ``sample``, ``num_inference_steps`` at most
    ``num_train_timesteps``."""
    horizon = _whole(config, "horizon", 1, MAX_CHUNK_SIZE, file, field)
    history = _whole(config, "n_obs_steps", 1, horizon, file, field)
    steps = _whole(config, "n_action_steps", 1, horizon - history + 1, file, field)
    train = _whole(config, "num_train_timesteps", 1, MAX_DIFFUSION_STEPS, file, field)
    if config.get("num_inference_steps") is not None:
        _whole(config, "num_inference_steps", 1, train, file, field)
    for key, allowed in (("noise_scheduler_type", ("DDPM", "DDIM")),
                         ("prediction_type", ("epsilon", "sample"))):
        if config.get(key) not in allowed:
            raise ConfigError.one(file, field, f"{key} {config.get(key)!r}", "a diffusion "
                                  f"policy's {key} must be one of {', '.join(allowed)}")
    return history, steps


def probe_bytes(chunk_size: int, obs_dim: int, images: Mapping[str, tuple[int, ...]]) -> int:
    """Bytes of :func:`probe_observations` for chunks of ``chunk_size``: ``2 * chunk_size + 1``
    steps of :data:`WORLDS` worlds, the state as float64 drawn then float32 kept, each image
    one byte a pixel channel."""
    frame = sum(int(np.prod(shape)) for shape in images.values())
    return (2 * chunk_size + 1) * WORLDS * (obs_dim * 12 + frame)


def read_folder(path: Path, spec: TaskSpec, file: str | Path, field: str,
                camera_keys: Mapping[str, str] | None = None) -> LeRobotFolder:
    """Read the LeRobot policy folder at ``path`` (:func:`pretrained_folder`) and match it to
    ``spec``'s task, without running any of it: its type, features and processor steps
    (module doc). ``camera_keys`` maps a task camera to the policy's image feature where their
    names differ (``{"front": "observation.images.top"}``); the others match by name. Any
    mismatch is a one-line :class:`~physai_core.errors.ConfigError` at ``file`` and ``field`` (a
    bad key map at the ``camera_keys`` field beside it)."""
    folder = pretrained_folder(path)
    if folder is None:
        raise ConfigError.one(file, field, str(path), "a folder without config.json and "
                              "model.safetensors (nor pretrained_model/ or checkpoints/last/"
                              "pretrained_model/ holding them): not a LeRobot policy")
    config = _json(folder / "config.json", file, field, str(path))
    kind = str(config.get("type"))
    if kind not in SUPPORTED:
        raise ConfigError.one(file, field, kind, "a LeRobot policy of a type not brought in "
                              f"here; supported: {', '.join(SUPPORTED)}")
    for name in PROCESSORS:
        _check_steps(folder / name, file, field)
    inputs, images = _match_inputs(config, spec, file, field, dict(camera_keys or {}))
    action = _shape(dict(config.get("output_features") or {}).get(ACTION))
    if action != (spec.act_dim,):
        raise ConfigError.one(file, field, f"{ACTION} {list(action)}", "the policy's action "
                              f"has {list(action)} entries, task {spec.name}'s {spec.act_dim}")
    history = 1
    if kind == "diffusion":
        history, chunk = _diffusion_chunking(config, file, field)
        steps, coeff = chunk, None
    else:
        chunk, steps, coeff = _chunking(config, file, field)
    size = probe_bytes(chunk, spec.obs_dim, images)
    if size > MAX_PROBE_BYTES:
        raise ConfigError.one(file, field, f"chunk_size {chunk}", f"chunks of {chunk:,} "
                              f"actions with task {spec.name}'s observations need "
                              f"{gib(size)} of probe observations to check parity, over the "
                              f"{gib(MAX_PROBE_BYTES)} allowed "
                              "(stages.core.limits.MAX_PROBE_BYTES)")
    return LeRobotFolder(folder, kind, inputs, images, chunk, steps, coeff,
                         folder_digest(folder), history)


def _check_steps(path: Path, file: str | Path, field: str) -> None:
    """Every step of the processor pipeline ``path`` is named by LeRobot's registry: a step
    named by a class path would import and build any installed class when loaded."""
    if not path.is_file():
        raise ConfigError.one(file, field, path.name, "the LeRobot policy has no processor "
                              "file of that name (saved by LeRobot 0.4 or later with its "
                              "pre- and postprocessor)")
    steps = _json(path, file, field, path.name).get("steps")
    if not isinstance(steps, list):
        raise ConfigError.one(file, field, path.name, "the processor file lists no steps")
    for step in steps:
        if not isinstance(step, dict) or not isinstance(step.get("registry_name"), str):
            shown = step.get("class") if isinstance(step, dict) else step
            raise ConfigError.one(file, field, f"{path.name}: {shown}", "a processor step not "
                                  "named by LeRobot's registry (a class path is code to import "
                                  "when loaded); only registered steps are admitted")


def _match_inputs(
    config: dict[str, Any], spec: TaskSpec, file: str | Path, field: str,
    camera_keys: dict[str, str],
) -> tuple[dict[str, str], dict[str, tuple[int, int, int]]]:
    """The policy's input features as graph inputs (the state as ``obs``, each camera image by
    the task's camera ``camera_keys`` maps to it, else of the same name), with each image
    input's frame shape."""
    features = dict(config.get("input_features") or {})
    cameras = {cam.name: cam for cam in spec.cameras if cam.rgb}
    by_feature = _camera_map(camera_keys, cameras, features, file,
                             field.replace("source", "camera_keys"))
    state = _shape(features.get(STATE))
    if state != (spec.obs_dim,):
        raise ConfigError.one(file, field, f"{STATE} {list(state)}", "the policy's state has "
                              f"{list(state) or 'no'} entries, task {spec.name}'s "
                              f"{spec.obs_dim}")
    inputs = {STATE: STATE_KEY}
    images: dict[str, tuple[int, int, int]] = {}
    for key, feature in features.items():
        if key == STATE:
            continue
        name = by_feature.get(key) or (key.removeprefix(IMAGES) if key.startswith(IMAGES)
                                       and key.removeprefix(IMAGES) not in camera_keys else None)
        camera = cameras.get(name) if name else None
        if camera is None:
            raise ConfigError.one(file, field, key, f"task {spec.name} has no observation of "
                                  "that name; its cameras: "
                                  f"{', '.join(IMAGES + c for c in cameras) or 'none'}")
        shape = _shape(feature)
        if shape != (3, camera.height, camera.width):
            raise ConfigError.one(file, field, f"{key} {list(shape)}", "the policy's image "
                                  f"size differs from camera {camera.name!r} of task "
                                  f"{spec.name}: [3, {camera.height}, {camera.width}]")
        inputs[key] = camera.image_key
        images[camera.image_key] = (camera.height, camera.width, 3)
    return inputs, images


def _camera_map(camera_keys: dict[str, str], cameras: Mapping[str, CameraSpec],
                features: Mapping[str, object], file: str | Path,
                field: str) -> dict[str, str]:
    """``camera_keys`` (task camera -> policy feature) checked and turned round: feature ->
    camera. An unknown camera or feature is one line."""
    for camera, feature in camera_keys.items():
        if camera not in cameras:
            raise ConfigError.one(file, field, camera, "the task has no camera of that name; "
                                  f"its cameras: {', '.join(cameras) or 'none'}")
        if feature not in features:
            raise ConfigError.one(file, field, feature, "the policy has no input of that "
                                  f"name; its inputs: {', '.join(features)}")
    return {feature: camera for camera, feature in camera_keys.items()}


def probe_observations(folder: LeRobotFolder, obs_dim: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Observations for the parity check, ``2 * chunk_size + 1`` steps of :data:`WORLDS`
    worlds: the state standard normal, (T, WORLDS, obs_dim) float32; each image uniform,
    (T, WORLDS, H, W, 3) uint8. Enough steps for LeRobot to query again and for ensembling
    to fill its window."""
    rng = np.random.default_rng(seed)
    steps = 2 * folder.chunk_size + 1
    probes: dict[str, np.ndarray] = {
        STATE_KEY: rng.standard_normal((steps, WORLDS, obs_dim)).astype(np.float32)}
    for name, shape in folder.images.items():
        probes[name] = rng.integers(0, 256, (steps, WORLDS, *shape), dtype=np.uint8)
    return probes


def _run_export(python: Path, folder: LeRobotFolder, work: Path, file: str | Path, field: str,
                opset: int) -> dict[str, Any]:
    """Run stages/policies/lerobot_export.py with ``python``, the ``lerobot`` environment's, on
    ``folder`` (files in ``work``); returns its report. Its refusal is a one-line ConfigError;
    a crash a PhysaiError with the end of its output."""
    request = {"source": str(folder.path), "inputs": folder.inputs,
               "onnx": str(work / "policy.onnx"), "probes": str(work / "probes.npz"),
               "reference": str(work / "reference.npz"), "report": str(work / "report.json"),
               "opset": opset, "latency_iters": 10}
    (work / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    try:
        # -I: the script's folder (stages/) and PYTHONPATH stay off the path; LeRobot's own
        # imports would find stages/datasets as ``datasets`` otherwise.
        done = subprocess.run([str(python), "-I", str(SCRIPT), str(work / "request.json")],
                              cwd=work, env=env, capture_output=True, text=True,
                              timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PhysaiError(f"{file}: {field}: the LeRobot export did not finish in "
                          f"{EXPORT_TIMEOUT_S:g} s") from None
    if done.returncode == 2:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "refused"
        raise ConfigError.one(file, field, str(folder.path), last)
    if done.returncode != 0:
        raise PhysaiError(f"{file}: {field}: the LeRobot export failed (exit status "
                          f"{done.returncode}): {done.stderr.strip()[-2000:]}")
    report: dict[str, Any] = json.loads((work / "report.json").read_text())
    return report


def chunked_actions(session: PolicySession, folder: LeRobotFolder,
                    probes: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The ONNX policy ``session`` run on ``probes`` as LeRobot runs the policy: queried when
    :class:`edge.runtime.ActionChunks` (the folder's chunk spec) is due; a diffusion policy
    through :class:`edge.runtime.DiffusionSampler`, shown every step's observation. Returns the
    actions (T, WORLDS, act_dim) and the first query's chunk (WORLDS, k, act_dim), float32."""

    sampler = session.sampler() if session.diffusion is not None else None

    def query(t: int) -> np.ndarray:
        frame = {name: probes[name][t] for name in session.inputs}
        return sampler(frame) if sampler is not None else session.run(frame)

    def skip(t: int) -> None:  # a diffusion policy keeps every step's observation
        if sampler is not None:
            sampler.observe({name: probes[name][t] for name in session.inputs})

    chunks = ActionChunks.from_spec(folder.chunk_spec, worlds=WORLDS)
    first = query(0)
    actions = [chunks.step(first)]
    for t in range(1, len(probes[STATE_KEY])):
        due = chunks.due()
        if not due:
            skip(t)
        actions.append(chunks.step(query(t) if due else None))
    return np.stack(actions), np.asarray(first, np.float32)


def export_policy(folder: LeRobotFolder, obs_dim: int, act_dim: int, *, work: Path,
                  file: str | Path, field: str, opset: int = 17) -> LeRobotExport:
    """Export ``folder``'s policy to ONNX in the ``lerobot`` environment and compare it with
    LeRobot's own answers on probe observations (module doc); files go to ``work``. The
    ``lerobot`` environment is looked up first: a missing one is one line before any probe is
    drawn."""
    python = require_python(ENVIRONMENT, f"{file}: {field}")
    probes = probe_observations(folder, obs_dim)
    arrays: dict[str, Any] = dict(probes)
    np.savez(work / "probes.npz", **arrays)
    report = _run_export(python, folder, work, file, field, opset)
    try:
        session = open_session(work / "policy.onnx", threads=1)
    except EdgeError as exc:
        raise ConfigError.one(file, field, str(folder.path), f"the exported graph: {exc}") \
            from None
    got = (session.obs_dim, session.act_dim, dict(session.images), session.chunk_size,
           session.history)
    want = (obs_dim, act_dim, folder.images, folder.chunk_size, folder.n_obs_steps)
    if got != want:
        raise ConfigError.one(file, field, str(folder.path), "the exported graph reads and "
                              f"emits (obs_dim, act_dim, images, chunk, history) {got}, not "
                              f"{want}")
    with np.load(work / "reference.npz", allow_pickle=False) as data:
        expected, expected_chunk = data["actions"], data["chunks"]
    actions, chunk = chunked_actions(session, folder, probes)
    raw = (work / "policy.onnx").read_bytes()
    diff = float(np.abs(actions.astype(np.float64) - expected).max())
    chunk_diff = float(np.abs(chunk.astype(np.float64) - expected_chunk).max())
    log.info("LeRobot %s %s policy exported: %s steps of %s worlds within %.2g of its "
             "select_action (first chunk %.2g)", report.get("lerobot"), folder.policy_type,
             len(actions), WORLDS, diff, chunk_diff)
    return LeRobotExport(raw, folder, diff, chunk_diff, len(actions), report)
