"""Edge target registry: lookups, refusals and preflight checks, generated from the registry."""

from __future__ import annotations

import dataclasses

import pytest

from edge.errors import EdgeError, TargetError
from edge.targets import (
    MIN_ONNX_OPSET,
    PRECISIONS,
    EdgeTarget,
    get_target,
    preflight,
    register_target,
    target_names,
)


def test_registry_holds_thor_and_orin() -> None:
    assert {"jetson-agx-thor", "jetson-agx-orin"} <= set(target_names())
    assert list(target_names()) == sorted(target_names())
    assert get_target("jetson-agx-thor").gpu_arch == "sm_110"
    assert get_target("jetson-agx-orin").gpu_arch == "sm_87"


@pytest.mark.parametrize("name", target_names())
def test_every_target_passes_its_own_limits(name: str) -> None:
    target = get_target(name)
    assert target.name == name
    assert target.jetpack and target.l4t and target.cuda and target.tensorrt
    assert target.gpu_arch.startswith("sm_")
    assert set(target.precisions) <= set(PRECISIONS)
    for precision in target.precisions:
        preflight(target, MIN_ONNX_OPSET, precision)
        preflight(target, target.max_onnx_opset, precision)
    preflight(target, 17, "fp32")


@pytest.mark.parametrize("name", target_names())
def test_every_target_refuses_an_opset_past_its_parser(name: str) -> None:
    target = get_target(name)
    with pytest.raises(TargetError, match=f"parses ONNX opsets 9-{target.max_onnx_opset}"):
        preflight(target, target.max_onnx_opset + 1, "fp32")
    with pytest.raises(TargetError, match=r"\(value: 8\)"):
        preflight(target, MIN_ONNX_OPSET - 1, "fp32")


def test_unknown_target_lists_valid_names_and_closest() -> None:
    with pytest.raises(TargetError) as caught:
        get_target("jetson-agx-thr")
    message = str(caught.value)
    assert "unknown edge target 'jetson-agx-thr'" in message
    assert "valid: jetson-agx-orin, jetson-agx-thor" in message
    assert message.endswith("did you mean 'jetson-agx-thor'?")
    assert caught.value.exit_code == 2 and isinstance(caught.value, EdgeError)


def test_unknown_target_without_close_match_has_no_hint() -> None:
    with pytest.raises(TargetError) as caught:
        get_target("raspberry-pi")
    assert "did you mean" not in str(caught.value)


def test_orin_refuses_fp8_and_names_its_precisions() -> None:
    orin = get_target("jetson-agx-orin")
    with pytest.raises(TargetError) as caught:
        preflight(orin, 17, "fp8")
    assert "supports precisions fp32, fp16, int8 (value: 'fp8')" in str(caught.value)
    preflight(get_target("jetson-agx-thor"), 17, "fp8")


def test_unknown_precision_names_closest() -> None:
    with pytest.raises(TargetError, match="did you mean 'fp16'"):
        preflight(get_target("jetson-agx-thor"), 17, "fp61")


def test_duplicate_registration_is_refused() -> None:
    thor = get_target("jetson-agx-thor")
    with pytest.raises(EdgeError, match="already registered"):
        register_target(dataclasses.replace(thor, device="another"))
    assert get_target("jetson-agx-thor") is thor


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"precisions": ()}, "precisions must be a non-empty subset"),
        ({"precisions": ("fp32", "fp64")}, "precisions must be a non-empty subset"),
        ({"max_onnx_opset": 7}, "max_onnx_opset must be at least 9"),
        ({"container_base": "ubuntu:24.04"}, "must be an NVIDIA l4t-jetpack image"),
        ({"container_base": "nvcr.io/nvidia/l4t-jetpack:r35.4.1"}, "tag must be r36.4.x"),
        ({"container_base": "nvcr.io/nvidia/l4t-jetpack:36.4.0"}, "tag must be r36.4.x"),
    ],
)
def test_malformed_target_is_refused(changes: dict[str, object], fragment: str) -> None:
    fields = dataclasses.asdict(get_target("jetson-agx-orin")) | {"name": "bad"} | changes
    with pytest.raises(EdgeError, match=fragment):
        EdgeTarget(**fields)


def test_targets_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_target("jetson-agx-orin").tensorrt = "8.6"  # type: ignore[misc]
