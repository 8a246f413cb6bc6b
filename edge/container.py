"""The robot computer's container recipe, generated with every bundle and checked against it.

:func:`dockerfile` writes a Dockerfile on the NVIDIA L4T JetPack image of the bundle's target
(``EdgeTarget.container_base``), which ships the target's CUDA and TensorRT. Built on the
Jetson from the unpacked bundle folder, the image runs ``engine.py``: it builds the TensorRT
engine, checks it against ONNX Runtime and writes the report into ``/opt/physai/out``.

:func:`check_dockerfile` parses a Dockerfile (comments, parser directives, line
continuations, JSON and shell forms) and refuses an unknown instruction, malformed JSON
arguments, a stage that does not start with ``FROM``, a base image or label that disagrees
with the target's row of the compatibility matrix, and a ``COPY`` of a file the bundle does not
hold.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from edge.errors import EdgeError
from edge.targets import EdgeTarget, l4t_tag_problem

NAME = "Dockerfile"
"""Member name of the recipe inside a bundle."""

WORKDIR = "/opt/physai/policy"
OUT_DIR = "/opt/physai/out"
PIP_PACKAGES = ("numpy>=1.26,<3", "onnxruntime>=1.20", "polygraphy>=0.49")
"""What the on-target scripts need beyond the base image's TensorRT Python bindings."""

INSTRUCTIONS = frozenset({
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
})
_JSON_FORM = frozenset({"CMD", "ENTRYPOINT", "RUN", "SHELL", "COPY", "ADD", "VOLUME"})
_DIRECTIVE = re.compile(r"#\s*(syntax|escape|check)\s*=", re.IGNORECASE)
LABEL_TARGET = "ai.physai.target"
LABEL_TENSORRT = "ai.physai.tensorrt"
LABEL_L4T = "ai.physai.l4t"


def dockerfile(target: EdgeTarget, manifest: Mapping[str, object], members: Collection[str]) -> str:
    """The Dockerfile of a bundle for ``target`` holding ``members`` (payload member names).

    ``manifest`` supplies the task and lineage shown in labels. Every member but the
    Dockerfile itself is copied to :data:`WORKDIR`, keeping its relative path.
    """
    lineage = manifest.get("lineage")
    policy = lineage.get("policy_digest", "") if isinstance(lineage, Mapping) else ""
    files = sorted({"manifest.json", *members} - {NAME})
    top = [name for name in files if "/" not in name]
    nested = [name for name in files if "/" in name]
    copies = [f"COPY {' '.join(top)} ./"]
    copies += [f"COPY {name} ./{name.rsplit('/', 1)[0]}/" for name in nested]
    pip = " ".join(shlex.quote(p) for p in PIP_PACKAGES)
    lines = [
        "# syntax=docker/dockerfile:1",
        f"# Robot-computer image of a {manifest.get('task', 'physai')} policy for {target.name}",
        f"# ({target.device}: JetPack {target.jetpack}, L4T {target.l4t}, CUDA {target.cuda},",
        f"# TensorRT {target.tensorrt}, {target.gpu_arch}). Build and run on the Jetson, in the",
        "# unpacked bundle folder:",
        "#   docker build -t physai-policy .",
        f"#   docker run --rm --runtime nvidia -v \"$PWD/out:{OUT_DIR}\" physai-policy",
        f"FROM {target.container_base}",
        f'LABEL org.opencontainers.image.title="physai policy {manifest.get("task", "")}" \\',
        f'      ai.physai.policy="{policy}" \\',
        f'      {LABEL_TARGET}="{target.name}" \\',
        f'      {LABEL_TENSORRT}="{target.tensorrt}" \\',
        f'      {LABEL_L4T}="{target.l4t}"',
        "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONDONTWRITEBYTECODE=1 "
        f"PHYSAI_TARGET={target.name}",
        "RUN apt-get update \\",
        "    && apt-get install -y --no-install-recommends python3-pip \\",
        "    && rm -rf /var/lib/apt/lists/* \\",
        f"    && python3 -m pip install --no-cache-dir {pip}",
        f"WORKDIR {WORKDIR}",
        *copies,
        f"VOLUME {OUT_DIR}",
        f'ENTRYPOINT ["python3", "{WORKDIR}/engine.py", "{WORKDIR}", "--out", "{OUT_DIR}"]',
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Instruction:
    """One logical Dockerfile line: its instruction, arguments and first physical line number."""

    line: int
    keyword: str
    args: str


def parse_dockerfile(text: str, where: str = NAME) -> list[Instruction]:
    """Split ``text`` into instructions, joining ``\\`` continuations and dropping comments.

    Refuses an unknown instruction, a continuation that runs off the end, and JSON-form
    arguments that are not a JSON array of strings.
    """
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        out.append(_instruction(" ".join(p for p in pending if p), start, where))
        pending = []
    if pending:
        raise EdgeError(f"{where}: line {start}: continuation runs past the end of the file")
    return out


def _instruction(logical: str, line: int, where: str) -> Instruction:
    keyword, _, args = logical.partition(" ")
    keyword = keyword.upper()
    if keyword not in INSTRUCTIONS:
        raise EdgeError(f"{where}: line {line}: unknown instruction {keyword!r}")
    args = args.strip()
    if not args:
        raise EdgeError(f"{where}: line {line}: {keyword} has no arguments")
    if keyword in _JSON_FORM and args.startswith("["):
        try:
            value = json.loads(args)
        except ValueError as exc:
            raise EdgeError(f"{where}: line {line}: {keyword} JSON form is not valid JSON "
                            f"({exc})") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise EdgeError(f"{where}: line {line}: {keyword} JSON form must be an array of "
                            f"strings (value: {args})")
    return Instruction(line, keyword, args)


def _words(ins: Instruction) -> list[str]:
    """Arguments of a JSON- or shell-form instruction as a list of words, flags dropped."""
    words = json.loads(ins.args) if ins.args.startswith("[") else shlex.split(ins.args)
    return [w for w in words if not w.startswith("--")]


def _labels(args: str) -> dict[str, str]:
    labels = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        if sep:
            labels[key] = value
    return labels


def check_dockerfile(
    text: str, target: EdgeTarget, members: Collection[str], where: str = NAME
) -> list[Instruction]:
    """Check a bundle's Dockerfile against ``target`` and the bundle's ``members``.

    Returns the parsed instructions; raises :class:`EdgeError` with a one-line message naming
    ``where``, the line and the value on the first problem.
    """
    instructions = parse_dockerfile(text, where)
    stages = [ins for ins in instructions if ins.keyword == "FROM"]
    first = next((ins for ins in instructions if ins.keyword != "ARG"), None)
    if first is None or first.keyword != "FROM":
        line = first.line if first else 1
        raise EdgeError(f"{where}: line {line}: the first instruction after ARG must be FROM")
    if len(stages) != 1:
        raise EdgeError(f"{where}: line {stages[1].line}: one build stage expected, "
                        f"found {len(stages)}")
    image = first.args.split()[0]
    problem = l4t_tag_problem(image, target.l4t)
    if image != target.container_base or problem:
        raise EdgeError(f"{where}: line {first.line}: base image must be "
                        f"{target.container_base} for {target.name} (value: {image!r})")
    labels: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "LABEL":
            labels |= _labels(ins.args)
    for key, want in ((LABEL_TARGET, target.name), (LABEL_TENSORRT, target.tensorrt),
                      (LABEL_L4T, target.l4t)):
        if labels.get(key) != want:
            raise EdgeError(f"{where}: label {key} must be {want!r} for {target.name} "
                            f"(value: {labels.get(key)!r})")
    available = {"manifest.json", *members}
    for ins in instructions:
        if ins.keyword in ("COPY", "ADD"):
            sources = _words(ins)[:-1]
            for source in sources:
                if source not in available:
                    raise EdgeError(f"{where}: line {ins.line}: {ins.keyword} source "
                                    f"{source!r} is not a file of the bundle")
        if ins.keyword == "ENTRYPOINT":
            scripts = [w.rsplit("/", 1)[-1] for w in _words(ins) if w.endswith(".py")]
            missing = [s for s in scripts if s not in available]
            if missing:
                raise EdgeError(f"{where}: line {ins.line}: ENTRYPOINT runs {missing[0]!r}, "
                                "which the bundle does not hold")
    return instructions
