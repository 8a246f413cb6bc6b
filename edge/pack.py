"""Assemble a policy bundle: the model, its calibration set, the on-target scripts and recipe.

A bundle holds everything the robot computer needs and nothing that varies between runs:

- ``policy.onnx``: the exported policy (normalizer inside, ``obs`` -> ``actions``);
- ``calibration/obs.npy``: training observations for INT8 calibration and the engine check;
  for a policy that sees, also ``calibration/<camera>_image.npy``, the camera frames of the
  same samples (uint8, (N, H, W, 3));
- ``engine.py``: the on-target TensorRT build, check and timing (:mod:`edge.engine`);
- ``runtime.py``: the on-robot runtime (:mod:`edge.runtime`);
- ``Dockerfile``: the container recipe on the target's L4T JetPack image (:mod:`edge.container`);
- ``manifest.json``: I/O, normalization, control rate, target, precision, parity, engine
  tolerances, lineage and every file's digest, following ``edge/manifest.schema.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge import container, engine
from edge.bundle import canonical_json, write_bundle
from edge.manifest import validate_manifest
from edge.runtime import FORMAT_VERSION, MANIFEST_NAME
from edge.targets import EdgeTarget, get_target

SCRIPTS = ("engine.py", "runtime.py")
"""On-target scripts copied from this package into every bundle."""

SIGNING_KEY_VAR = "PHYSAI_SIGNING_KEY"
"""Environment variable naming the PEM private key file the package stage signs bundles with."""


def signing_key_from_environment() -> Path | None:
    """The signing key file :data:`SIGNING_KEY_VAR` names, or None when it is unset or empty."""
    value = os.environ.get(SIGNING_KEY_VAR, "").strip()
    return Path(value) if value else None


def pack_policy_bundle(
    out_path: Path,
    onnx_path: Path,
    calibration: np.ndarray | Mapping[str, np.ndarray],
    calibration_source: str,
    manifest: Mapping[str, Any],
    target: EdgeTarget,
    *,
    signing_key: Path | None = None,
) -> str:
    """Write the bundle of ``onnx_path`` to ``out_path``; return the tar's sha256.

    The bundle is signed with ``signing_key`` (a PEM elliptic-curve private key file), or
    with the one whose path :data:`SIGNING_KEY_VAR` names when the argument is None; with
    neither it is unsigned.

    ``manifest`` holds every schema field but ``files``, ``format_version`` and ``engine``,
    which are added here; ``calibration`` (float32, (N, obs_dim)) is stored as
    ``calibration/obs.npy``. For a policy that sees, ``calibration`` maps every graph input
    to its N samples (``obs`` float32 (N, obs_dim), each ``<camera>_image`` uint8
    (N, H, W, 3)), each stored as ``calibration/<input>.npy`` and listed in the manifest's
    ``engine.calibration.inputs``. A manifest that breaks the schema is refused before
    anything is written.
    """
    work = out_path.parent / f".{out_path.name}.parts"
    arrays = engine.calibration_arrays(calibration)
    members = {name: engine.calibration_member(name) for name in arrays}
    here = Path(__file__).parent
    payload: dict[str, Path] = {"policy.onnx": Path(onnx_path)}
    payload |= {members[name]: work / f"calibration-{name}.npy" for name in arrays}
    payload |= {name: here / name for name in SCRIPTS}
    described: dict[str, Any] = {"member": engine.CALIBRATION_NAME,
                                 "samples": len(arrays[engine.INPUT_NAME]),
                                 "source": calibration_source}
    if len(arrays) > 1:
        described["inputs"] = members
    fields = {
        **manifest,
        "engine": {"tolerances": dict(engine.PRECISION_TOLERANCE), "calibration": described},
    }
    names = sorted([*payload, container.NAME])
    placeholder = {name: {"sha256": "0" * 64, "bytes": 0} for name in names}
    draft = {**fields, "files": placeholder, "format_version": FORMAT_VERSION}
    validate_manifest(json.loads(canonical_json(draft)), out_path)
    work.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        np.save(payload[members[name]], array, allow_pickle=False)
    recipe = work / container.NAME
    recipe.write_text(container.dockerfile(target, fields, names))
    payload[container.NAME] = recipe
    try:
        key = signing_key if signing_key is not None else signing_key_from_environment()
        return write_bundle(out_path, payload, fields, signing_key=key)
    finally:
        for part in work.iterdir():
            part.unlink()
        work.rmdir()


def packed_members(manifest: Mapping[str, Any]) -> dict[str, bytes | None]:
    """Every member this version packs for ``manifest`` (a checked one, as
    :func:`edge.manifest.check_bundle` returns it), by name: the scripts of :data:`SCRIPTS` and
    the Dockerfile :func:`edge.container.dockerfile` renders for its target and files, by
    their bytes; the manifest, the model and the calibration members, whose bytes are the
    policy's own, as None. What ``flows bundle verify`` compares a bundle's code with
    (:func:`edge.bundle.member_differences`)."""
    calibration = manifest["engine"]["calibration"]
    data = {MANIFEST_NAME, engine.MODEL_NAME, calibration["member"],
            *calibration.get("inputs", {}).values()}
    packed: dict[str, bytes | None] = dict.fromkeys(sorted(data))
    here = Path(__file__).parent
    packed |= {name: (here / name).read_bytes() for name in SCRIPTS}
    recipe = container.dockerfile(get_target(manifest["target"]["name"]), manifest,
                                  manifest["files"])
    packed[container.NAME] = recipe.encode()
    return packed
