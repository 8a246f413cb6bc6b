"""The Jetson container recipe: generated per target, parsed, and checked against the matrix."""

from __future__ import annotations

import json

import pytest

from edge.container import NAME, check_dockerfile, dockerfile, parse_dockerfile
from edge.errors import EdgeError
from edge.targets import get_target, target_names

MEMBERS = ["Dockerfile", "calibration/obs.npy", "engine.py", "policy.onnx", "runtime.py"]
MANIFEST = {"task": "reach-v0", "lineage": {"policy_digest": "ab" * 32}}


@pytest.mark.parametrize("name", target_names())
def test_generated_recipe_checks_for_every_target(name: str) -> None:
    target = get_target(name)
    text = dockerfile(target, MANIFEST, MEMBERS)
    instructions = check_dockerfile(text, target, MEMBERS)
    keywords = [i.keyword for i in instructions]
    assert keywords[0] == "FROM" and keywords.count("FROM") == 1
    assert instructions[0].args == target.container_base
    assert f"r{'.'.join(target.l4t.split('.')[:2])}." in target.container_base
    copied = set()
    for ins in instructions:
        if ins.keyword == "COPY":
            copied |= set(ins.args.split()[:-1])
    assert copied == {"manifest.json", *MEMBERS} - {NAME}
    entry = json.loads(next(i.args for i in instructions if i.keyword == "ENTRYPOINT"))
    assert entry[:2] == ["python3", "/opt/physai/policy/engine.py"]


def test_recipes_differ_by_target() -> None:
    thor, orin = (dockerfile(get_target(n), MANIFEST, MEMBERS)
                  for n in ("jetson-agx-thor", "jetson-agx-orin"))
    with pytest.raises(EdgeError, match="base image must be"):
        check_dockerfile(thor, get_target("jetson-agx-orin"), MEMBERS)
    assert "TensorRT 10.13" in thor and "TensorRT 10.3" in orin


def test_continuations_and_comments_are_joined() -> None:
    text = "# c\nFROM a:b\nRUN echo 1 \\\n  # inside\n  && echo 2\n"
    instructions = parse_dockerfile(text)
    assert [(i.line, i.keyword, i.args) for i in instructions] == [
        (2, "FROM", "a:b"), (3, "RUN", "echo 1 && echo 2")
    ]


def _edit(old: str, new: str) -> str:
    text = dockerfile(get_target("jetson-agx-orin"), MANIFEST, MEMBERS)
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (_edit("WORKDIR /opt", "WORKDIRR /opt"), "unknown instruction 'WORKDIRR'"),
        (_edit('"--out", "/opt/physai/out"]', '"--out", /opt/physai/out]'),
         "ENTRYPOINT JSON form is not valid JSON"),
        (_edit('["python3",', '[3,'), "JSON form must be an array of strings"),
        (_edit("COPY engine.py", "COPY missing.bin engine.py"),
         "COPY source 'missing.bin' is not a file of the bundle"),
        (_edit('ai.physai.tensorrt="10.3"', 'ai.physai.tensorrt="8.6"'),
         "label ai.physai.tensorrt must be '10.3'"),
        (_edit("FROM nvcr.io/nvidia/l4t-jetpack:r36.4.0", "FROM ubuntu:22.04"),
         "base image must be nvcr.io/nvidia/l4t-jetpack:r36.4.0"),
        (_edit("FROM nvcr", "RUN true\nFROM nvcr"), "first instruction after ARG must be FROM"),
        (_edit("VOLUME /opt/physai/out", "FROM scratch"), "one build stage expected"),
        (_edit("/opt/physai/policy/engine.py", "/opt/physai/policy/train.py"),
         "ENTRYPOINT runs 'train.py'"),
        (_edit('"/opt/physai/out"]\n', '"/opt/physai/out"] \\\n'),
         "continuation runs past the end"),
        (_edit("VOLUME /opt/physai/out", "VOLUME"), "VOLUME has no arguments"),
    ],
)
def test_broken_recipe_is_refused_in_one_line(text: str, fragment: str) -> None:
    with pytest.raises(EdgeError) as caught:
        check_dockerfile(text, get_target("jetson-agx-orin"), MEMBERS, where="b.tar: Dockerfile")
    message = str(caught.value)
    assert message.startswith("b.tar: Dockerfile") and fragment in message
    assert "\n" not in message
