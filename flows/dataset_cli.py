"""``flows dataset``: import a dataset file into the store, inspect a file or a stored dataset,
export a stored dataset (or a model version's training dataset) to any registered format.

::

    flows dataset import PATH --format isaaclab|robomimic|lerobot|minari [--task T]
                               [--obs-keys k1,k2,...] [--action-units native|normalized]
                               [--camera-keys front=observation.images.top,...] [--json]
    flows dataset inspect PATH|DIGEST [--format F] [--task T] [--obs-keys ...]
                                      [--camera-keys ...] [--json]
    flows dataset export DIGEST|models:/NAME@ALIAS --format F -o PATH

A bad file is one line naming the file, the key and the value, exit status 2, and nothing is
published (docs/datasets.md). A task that observes through cameras has each camera's images
(``<camera>_image``) checked against its declared size and dtype, and carried into the store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from physai_core.errors import ConfigError
from stages.core.units import UNITS

EXPERIMENT = "physai-datasets"
"""MLflow experiment of the runs that import datasets from the command line."""
CAMERA_KEYS_HELP = ("LeRobot camera features by the task's camera names, comma-separated "
                    "CAMERA=FEATURE (default: observation.images.<camera>), e.g. "
                    "front=observation.images.top")
_DIGEST = re.compile(r"^(sha256:)?([0-9a-f]{64})$")


def _keys(value: str | None) -> tuple[str, ...]:
    return tuple(k.strip() for k in (value or "").split(",") if k.strip())


def _say(console: Console, line: str) -> None:
    console.print(line, soft_wrap=True, highlight=False, markup=False)


def _camera_keys(args: argparse.Namespace, path: str, fmt: str | None) -> Any:
    """The context a reader runs in: ``--camera-keys`` as LeRobot's key map (a LeRobot
    dataset's camera features by the task's camera names); without it, nothing."""
    from stages.datasets.lerobot_format import camera_keys, parse_camera_keys

    given = getattr(args, "camera_keys", None)
    if not given:
        return contextlib.nullcontext()
    if fmt != "lerobot":
        raise ConfigError.one(path, "--camera-keys", given,
                              "camera keys are mapped for --format lerobot only")
    return camera_keys(parse_camera_keys(given))


def cmd_import(args: argparse.Namespace, console: Console) -> int:
    """Check a file against its task, publish it as a Dataset and print its digest."""
    from flows.servers import prepare_environment
    from stages.artifacts.records import Producer
    from stages.core.hashing import sha256_json
    from stages.core.settings import resolve_settings
    from stages.datasets.importer import IMPORT_VERSION, convert, publish_converted
    from stages.orchestration.context import code_revision, open_services

    source = Path(args.path)
    scratch = resolve_settings().home / "tmp" / str(os.getpid())
    with _camera_keys(args, args.path, args.format):
        converted = convert(source, args.format, scratch, args.task, _keys(args.obs_keys),
                            args.action_units)
    try:
        prepare_environment()
        _, store, lineage = open_services()
        run = lineage.start_run(args.experiment, f"import-{source.name}",
                                {"physai.stage": "import"})
    except BaseException:
        converted.discard()
        raise
    described: dict[str, Any] = {"format": converted.format, "task": converted.task,
                                 "obs_keys": list(converted.obs_keys)}
    if args.action_units is not None:
        described["action_units"] = args.action_units
    producer = Producer(
        stage="import", stage_version=IMPORT_VERSION, code_revision=code_revision(),
        config_digest=sha256_json(described))
    # stdout carries only the digest (or the JSON object): MLflow's run link goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            dataset = publish_converted(converted, store, producer, run)
        except BaseException:
            run.flush()
            lineage.end_run(run.run_id, "FAILED")
            raise
        lineage.end_run(run.run_id)
    if args.json:
        print(json.dumps({
            "digest": dataset.digest, "uri": dataset.uri, "task": dataset.task,
            "episodes": dataset.episodes, "transitions": dataset.transitions,
            "format": converted.format, "source": str(source),
            "source_sha256": converted.source_digest, "obs_keys": list(converted.obs_keys),
            "success_rate": dataset.expert_success_rate, "mlflow_run_id": run.run_id,
            "action_units": converted.action_units, "actions_converted": converted.conversion,
            "images": list(converted.image_keys),
        }))
    else:
        _say(console, dataset.digest)
    return 0


def _inspect_file(args: argparse.Namespace) -> dict[str, Any]:
    from physai_core.errors import UnknownNameError
    from stages.datasets.formats import check_recording, get_format, guess_format
    from stages.datasets.importer import read_for_task, source_digest, source_units
    from stages.sim.tasks.catalog import get_task

    path = Path(args.target)
    fmt = args.format or guess_format(path)
    if fmt is None:
        raise ConfigError.one(path, "--format", None,
                              "not a dataset of any registered format; pass --format")
    try:
        reader = get_format(fmt)
    except UnknownNameError as exc:
        raise ConfigError.one(path, "--format", fmt, str(exc)) from None
    with _camera_keys(args, args.target, fmt):
        task, rec = read_for_task(path, reader, args.task, _keys(args.obs_keys))
    out: dict[str, Any] = {
        "path": str(path), "format": fmt, "sha256": source_digest(path),
        "task": task, "obs_keys": list(rec.obs_keys),
        "episodes": len(rec.episodes),
        "transitions": int(sum(len(e.actions) for e in rec.episodes)),
        "obs_width": int(rec.episodes[0].obs.shape[-1]) if rec.episodes else None,
        "action_width": int(rec.episodes[0].actions.shape[-1]) if rec.episodes else None,
        "action_units": source_units(fmt, rec),
        "images": {key: {"shape": list(frames.shape[1:]), "dtype": str(frames.dtype)}
                   for key, frames in (rec.episodes[0].images if rec.episodes else {}).items()},
    }
    if task is not None:
        spec = get_task(task)
        episodes = check_recording(path, rec, spec.obs_dim, spec.act_dim, spec.cameras)
        out["success_rate"] = sum(e.success for e in episodes) / len(episodes)
        out["checked"] = f"widths {spec.obs_dim}/{spec.act_dim}, finite, episode structure"
        if spec.cameras:
            out["checked"] += ", camera images " + ", ".join(
                f"{key} {cam.shape(key)} {cam.dtype(key)}"
                for cam in spec.cameras for key in cam.tensors())
    return out


def _inspect_stored(digest: str) -> dict[str, Any]:
    from stages.artifacts.records import Dataset
    from stages.orchestration.context import open_services

    _, store, _ = open_services()
    found = store.get(digest)
    if not isinstance(found, Dataset):
        raise ConfigError.one(digest, "kind", found.kind, "not a dataset")
    store.open_payload(found)
    return {"digest": found.digest, "uri": found.uri, "task": found.task,
            "episodes": found.episodes, "transitions": found.transitions,
            "obs_width": len(found.obs_names), "action_width": len(found.action_names),
            "expert": found.expert, "success_rate": found.expert_success_rate,
            "source_sha256": found.source_sha256, "source_format": found.source_format,
            "producer": found.producer.stage, "mlflow_run_id": found.mlflow_run_id,
            "verified": True}


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    """Print what a dataset file or folder, or a stored dataset, holds."""
    digest = _DIGEST.fullmatch(args.target)
    if digest is not None and not Path(args.target).exists():
        info = _inspect_stored(digest.group(2))
    else:
        info = _inspect_file(args)
    if args.json:
        print(json.dumps(info))
        return 0
    for key, value in info.items():
        _say(console, f"{key}: {value}")
    return 0


def _dataset_of(ref: str) -> Any:
    """The stored Dataset ``ref`` names: a digest, or a model version's training dataset."""
    from stages.artifacts.records import Dataset, Policy
    from stages.orchestration.context import open_services

    _, store, lineage = open_services()
    if ref.startswith("models:/"):
        tags = lineage.resolve_model(ref).tags
        digest = tags.get("physai.dataset.digest")
        if digest is None and "physai.policy.digest" in tags:
            policy = store.get(tags["physai.policy.digest"])
            if isinstance(policy, Policy) and policy.parents:
                digest = policy.parents[0]
        if digest is None:
            raise ConfigError.one(ref, "physai.dataset.digest", None,
                                  "the model version was trained on no dataset")
    else:
        match = _DIGEST.fullmatch(ref)
        if match is None:
            raise ConfigError.one(ref, "DIGEST", ref,
                                  "expected a dataset digest or models:/NAME@ALIAS")
        digest = match.group(2)
    found = store.get(digest)
    if not isinstance(found, Dataset):
        raise ConfigError.one(ref, "kind", found.kind, f"{digest} is not a dataset")
    return found, store


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    """Write a stored dataset, or a model version's training dataset, in a format."""
    from flows.servers import prepare_environment
    from stages.datasets.importer import export_dataset

    if args.ref.startswith("models:/"):
        prepare_environment()
    dataset, store = _dataset_of(args.ref)
    out = export_dataset(dataset, store, args.format, Path(args.out))
    _say(console, f"{out}: {dataset.episodes} episodes, {dataset.transitions} transitions of "
         f"{dataset.task} as {args.format} (dataset {dataset.digest})")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's subcommands to ``flows``."""
    dataset = sub.add_parser("dataset", help="import, inspect or export datasets "
                             "(Isaac Lab, robomimic, LeRobot v3, Minari)")
    verbs = dataset.add_subparsers(dest="dataset_command", required=True)
    imp = verbs.add_parser("import", help="check a dataset file against its task and publish it")
    imp.add_argument("path", help="dataset file (HDF5) or folder (LeRobot, Minari)")
    imp.add_argument("--format", required=True,
                     help="isaaclab, robomimic, lerobot, minari, or a plugin's format")
    imp.add_argument("--task", help="task id (default: the one the file names)")
    imp.add_argument("--obs-keys", help="observation keys joined in this order, comma-separated")
    imp.add_argument("--action-units", choices=UNITS, default=None,
                     help="the units of the file's actions: native (the environment's own; "
                     "converted to the task's -1..1) or normalized (default: what the file "
                     "says, else the format's: native for minari and lerobot, normalized for "
                     "robomimic and isaaclab)")
    imp.add_argument("--camera-keys", help=CAMERA_KEYS_HELP)
    imp.add_argument("--json", action="store_true", help="print one JSON object")
    imp.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment of the run")
    imp.set_defaults(func=cmd_import)
    ins = verbs.add_parser("inspect", help="print what a dataset file or stored dataset holds")
    ins.add_argument("target", help="dataset file or folder, or a dataset digest in the store")
    ins.add_argument("--format", help="the file's format (default: recognized from the file)")
    ins.add_argument("--task", help="task to check the file against")
    ins.add_argument("--obs-keys", help="observation keys joined in this order, comma-separated")
    ins.add_argument("--camera-keys", help=CAMERA_KEYS_HELP)
    ins.add_argument("--json", action="store_true", help="print one JSON object")
    ins.set_defaults(func=cmd_inspect)
    exp = verbs.add_parser("export", help="write a stored dataset in a format")
    exp.add_argument("ref", help="dataset digest, or models:/NAME@ALIAS (its training dataset)")
    exp.add_argument("--format", required=True,
                     help="isaaclab, robomimic, lerobot, minari, or a plugin's format")
    exp.add_argument("-o", "--out", required=True,
                     help="new file (HDF5) or folder (LeRobot; Minari: .../<namespace>/"
                          "<name>-v<N>)")
    exp.set_defaults(func=cmd_export)
