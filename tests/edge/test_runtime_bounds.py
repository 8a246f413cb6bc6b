"""Numbers from a bundle's manifest are bounded before the runtime allocates anything by them
(issue 42, item 3): a chunk size, an action width, an image side, each over its named limit,
is a one-line refusal; :class:`edge.runtime.ActionChunks` refuses a chunk size over
:data:`edge.runtime.MAX_CHUNK_SIZE` before it sizes its buffers; the published schema says
the same limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from edge import runtime
from edge.bundle import write_bundle
from edge.manifest import schema
from edge.runtime import RuntimeRefusal, load_bundle

HUGE = 2**40


def huge_actions_graph(path: Path) -> Path:
    """A graph that reads ``obs`` (batch, 4) and declares ``actions`` (batch, 2**40): it loads
    in ONNX Runtime (nothing runs), so only the manifest's bound stands before the runtime
    sizes the action range by it."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["actions"])], "huge",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", HUGE])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [1, HUGE])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def manifest(act_dim: int, **io: Any) -> dict[str, Any]:
    return {"io": {"obs": {"name": "obs", "shape": ["batch", 4]},
                   "actions": {"name": "actions", "shape": ["batch", act_dim],
                               "range": [-1.0, 1.0]}, **io},
            "control_hz": 50.0, "latency_budget_ms": 20.0, "target": {"name": "test"}}


def refusal(tmp_path: Path, body: dict[str, Any]) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    bundle = tmp_path / "b.tar"
    write_bundle(bundle, {"policy.onnx": huge_actions_graph(tmp_path / "p.onnx")}, body)
    with pytest.raises(RuntimeRefusal) as info:
        load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                    allow_unsigned=True)
    line = str(info.value)
    assert "\n" not in line and len(line) < 400, line
    return line


def test_an_action_width_of_2_40_is_refused_before_the_range_is_sized(tmp_path: Path) -> None:
    line = refusal(tmp_path, manifest(HUGE))
    assert "field 'io.actions.shape' must end in 1 .. 65,536 entries (value: " \
           "1,099,511,627,776)" in line, line
    assert not any((tmp_path / "run").iterdir())


def test_a_chunk_size_and_an_image_side_over_their_limits_are_refused(tmp_path: Path) -> None:
    chunk = manifest(4, chunk={"size": HUGE, "execute": 1})
    chunk["io"]["actions"]["shape"] = ["batch", HUGE, 4]
    assert "'io.chunk': chunk size must be at most 1,024 actions (value: " \
           "1,099,511,627,776)" in refusal(tmp_path / "c", chunk)
    image = manifest(4, images=[{"name": "front_image", "shape": ["batch", HUGE, 64, 3],
                                 "dtype": "uint8", "layout": "HWC", "channels": "RGB",
                                 "camera": "front"}])
    assert "sides 1 .. 4,096 (value: ['batch', 1099511627776, 64, 3])" in \
        refusal(tmp_path / "i", image)


def test_action_chunks_refuse_a_size_over_the_limit_before_allocating() -> None:
    runtime.ActionChunks(runtime.MAX_CHUNK_SIZE, execute=1)
    with pytest.raises(ValueError, match="chunk size must be at most 1,024 actions"):
        runtime.ActionChunks(HUGE, ensemble=0.01, worlds=4)


def test_the_schema_publishes_the_runtimes_limits() -> None:
    io = schema()["properties"]["io"]["properties"]
    assert io["chunk"]["properties"]["size"]["maximum"] == runtime.MAX_CHUNK_SIZE
    tensor = schema()["$defs"]["tensor"]["properties"]["shape"]["prefixItems"]
    assert [d["maximum"] for d in tensor[1:]] == [runtime.MAX_VECTOR_WIDTH] * 2
    image = schema()["$defs"]["image"]["properties"]["shape"]["prefixItems"]
    assert [d["maximum"] for d in image[1:3]] == [runtime.MAX_IMAGE_SIDE] * 2
