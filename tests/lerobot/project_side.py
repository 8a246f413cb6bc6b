"""The project's side of the LeRobot tests: run by the project's own interpreter (its venv, not
the lerobot stage environment), from the tests in this folder, with arrays crossing as npz
files. LeRobot's side never imports the project.

    python tests/lerobot/project_side.py export EPISODES.npz OUT_FOLDER
    python tests/lerobot/project_side.py read FOLDER OUT.npz [--obs-keys K1,K2]
                                                               [--camera-keys CAM=FEATURE]

``export`` writes the npz's episodes (:func:`tests.lerobot.frames.episodes` names, and
``instruction<i>`` where an episode has one) as reach-vision-v0 with this project's LeRobot
writer; ``read`` reads a LeRobot folder with this project's reader and checks it against
reach-vision-v0 (what ``flows dataset import`` does before it publishes), then saves the
episodes in the same names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def export(episodes_npz: Path, out: Path) -> None:
    from stages.datasets.demonstrations import Episode
    from stages.datasets.formats import Export, get_format
    from stages.sim.tasks.catalog import get_task
    from tests.lerobot.frames import TASK

    spec = get_task(TASK)
    arrays = np.load(episodes_npz)
    n = sum(1 for k in arrays.files if k.startswith("actions"))
    eps = []
    for i in range(n):
        actions = arrays[f"actions{i}"]
        steps = len(actions)
        told = str(arrays[f"instruction{i}"]) if f"instruction{i}" in arrays.files else None
        eps.append(Episode(arrays[f"obs{i}"], actions, np.zeros(steps, np.float32),
                           np.arange(steps) == steps - 1, True, i,
                           {"front_image": arrays[f"front{i}"]}, told))
    get_format("lerobot").write(out, Export(tuple(eps), TASK, spec.obs_names,
                                            spec.action_names, spec.control_hz))


def read(folder: Path, out: Path, obs_keys: str, camera_keys: str) -> None:
    from stages.datasets.importer import read_checked
    from stages.datasets.lerobot_format import camera_keys as key_map
    from stages.datasets.lerobot_format import parse_camera_keys
    from tests.lerobot.frames import TASK

    keys = tuple(k for k in obs_keys.split(",") if k)
    with key_map(parse_camera_keys(camera_keys)):
        _, _, episodes = read_checked(folder, "lerobot", TASK, keys)
    arrays: dict[str, np.ndarray] = {}
    for i, e in enumerate(episodes):
        arrays.update({f"obs{i}": e.obs, f"actions{i}": e.actions,
                       f"front{i}": e.images["front_image"]})
        if e.instruction is not None:
            arrays[f"instruction{i}"] = np.array(e.instruction)
    np.savez(out, **arrays)


def main() -> None:
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb", required=True)
    exp = verbs.add_parser("export")
    exp.add_argument("episodes", type=Path)
    exp.add_argument("out", type=Path)
    rd = verbs.add_parser("read")
    rd.add_argument("folder", type=Path)
    rd.add_argument("out", type=Path)
    rd.add_argument("--obs-keys", default="")
    rd.add_argument("--camera-keys", default="")
    args = parser.parse_args()
    if args.verb == "export":
        export(args.episodes, args.out)
    else:
        read(args.folder, args.out, args.obs_keys, args.camera_keys)


if __name__ == "__main__":
    main()
