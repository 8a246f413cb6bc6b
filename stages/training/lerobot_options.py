"""Run in the ``lerobot`` stage environment (``.venv-lerobot``), never by the project's own
interpreter: check a ``train: {algorithm: lerobot}`` section's pass-through keys against LeRobot's
own config class of the policy type, and say what each policy type's fields are.

    python lerobot_options.py fields              -> {"act": [...], "diffusion": [...]}
    python lerobot_options.py check TYPE OPTIONS  -> {"problem": null} or {"problem": "...",
                                                     "key": KEY}

``check`` builds the config class with the options (LeRobot's ``__post_init__`` checks run: a
chunk shorter than the actions executed per chunk is refused there), with stand-in features of
no consequence. It imports only the standard library and LeRobot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

TYPES = ("act", "diffusion")
"""The LeRobot policy types the trainer stage trains (stages/training/lerobot_train.py)."""


def _config_class(kind: str) -> Any:
    import lerobot.policies  # noqa: F401  (registers each policy type's config class)
    from lerobot.configs.policies import PreTrainedConfig

    return PreTrainedConfig.get_choice_class(kind)


def fields() -> dict[str, list[str]]:
    """Every init field of each policy type's config class."""
    return {kind: sorted(f.name for f in dataclasses.fields(_config_class(kind)) if f.init)
            for kind in TYPES}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def check(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """``{"problem": None}`` when ``options`` build ``kind``'s config class, else the problem
    and the key it is about (None when LeRobot's message names none)."""
    cls = _config_class(kind)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in options:
        if key not in known:
            return {"problem": f"{cls.__name__} has no field of that name", "key": key}
    try:
        cls(**options, device="cpu", push_to_hub=False)
    except (TypeError, ValueError, NotImplementedError) as exc:
        message = _first_line(exc)
        named = next((k for k in options if k in message), None)
        return {"problem": f"{cls.__name__} refuses it: {message}", "key": named}
    return {"problem": None, "key": None}


def main(argv: list[str]) -> int:
    """Print the answer to ``argv`` as one JSON object."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if argv[:1] == ["fields"]:
        print(json.dumps(fields()))
        return 0
    if len(argv) == 3 and argv[0] == "check" and argv[1] in TYPES:
        print(json.dumps(check(argv[1], json.loads(argv[2]))))
        return 0
    print(f"usage: {sys.argv[0]} fields | check {{{'|'.join(TYPES)}}} OPTIONS_JSON",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
