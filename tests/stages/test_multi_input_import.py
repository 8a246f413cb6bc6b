"""A policy that sees, exported elsewhere (state and a camera under names of its own, CHW floats
in 0..1 or uint8 HWC): mapped to the task's ``obs`` and ``front_image``, wrapped into this
project's vision convention, and refused in one line where it does not fit the task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.policies.local import SeeingPolicy, load_actor
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, ImportedPolicy, import_policy
from tests.fixtures.foreign_vision_onnx import foreign_actions, foreign_vision_onnx

TASK = "reach-vision-v0"
WHERE = Where("pipeline.yaml", "train.source")
MAPPED = {"state": "obs", "rgb": "front_image"}


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return get_task(TASK)


def observations(n: int = 6, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Task states (n, 17) and front-camera frames (n, 64, 64, 3) uint8."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 17)).astype(np.float32),
            rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8))


def bring(tmp_path: Path, spec: TaskSpec, **fields: object) -> tuple[SeeingPolicy,
                                                                      ImportedPolicy]:
    """Import, store the result as a file and load it as every stage loads a policy."""
    imported = import_policy(ImportConfig(**fields), spec, base=tmp_path, where=WHERE)
    path = tmp_path / "stored.onnx"
    path.write_bytes(imported.onnx)
    act = load_actor(path)
    assert isinstance(act, SeeingPolicy)
    return act, imported


@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_a_foreign_vision_policy_is_stored_in_the_convention_and_acts_as_its_exporter_feeds_it(
    tmp_path: Path, spec: TaskSpec, layout: str
) -> None:
    import onnxruntime

    source = foreign_vision_onnx(tmp_path / "policy.onnx", layout)  # type: ignore[arg-type]
    act, imported = bring(tmp_path, spec, source="policy.onnx", inputs=MAPPED)
    assert act.inputs == ("obs", "front_image") and not imported.as_given
    assert imported.parity_max_abs_diff < 1e-6
    state, frames = observations()
    expected = foreign_actions(onnxruntime.InferenceSession(str(source)), state, frames,
                               layout)  # type: ignore[arg-type]
    np.testing.assert_allclose(act({"obs": state, "front_image": frames}), expected, atol=1e-6)


def test_a_wrongly_stated_pixel_range_acts_otherwise(tmp_path: Path, spec: TaskSpec) -> None:
    """The oracle above can fail: the same file told its floats are 0..255 sees other
    images, and its actions differ from its exporter's."""
    import onnxruntime

    source = foreign_vision_onnx(tmp_path / "policy.onnx", "chw")
    act, _ = bring(tmp_path, spec, source="policy.onnx", inputs=MAPPED,
                   image_range={"rgb": "0..255"})
    state, frames = observations()
    expected = foreign_actions(onnxruntime.InferenceSession(str(source)), state, frames, "chw")
    assert np.abs(act({"obs": state, "front_image": frames}) - expected).max() > 1e-3


def test_inputs_named_as_the_task_names_them_map_themselves(
    tmp_path: Path, spec: TaskSpec
) -> None:
    foreign_vision_onnx(tmp_path / "policy.onnx", "chw", names=("obs", "front_image"))
    act, imported = bring(tmp_path, spec, source="policy.onnx")
    assert act.inputs == ("obs", "front_image") and not imported.as_given  # CHW: wrapped


def test_a_vision_policy_in_the_convention_is_stored_as_given(
    tmp_path: Path, spec: TaskSpec
) -> None:
    from edge.export import export_onnx
    from stages.policies.vision import build_vision_policy

    module = build_vision_policy(17, 7, (8,), [("front_image", (64, 64, 3))], np.zeros(17),
                                 np.ones(17), (4, 4))
    path = export_onnx(module, 17, tmp_path / "own.onnx", images={"front_image": (64, 64, 3)})
    act, imported = bring(tmp_path, spec, source="own.onnx")
    assert imported.as_given and imported.onnx == path.read_bytes()
    assert act.inputs == ("obs", "front_image")


def test_a_layout_the_graph_cannot_say_is_stated(tmp_path: Path, spec: TaskSpec) -> None:
    foreign_vision_onnx(tmp_path / "policy.onnx", "chw", symbolic=True)
    with pytest.raises(ConfigError, match=r"train\.image_layout: the graph does not say"):
        bring(tmp_path, spec, source="policy.onnx", inputs=MAPPED)
    act, _ = bring(tmp_path, spec, source="policy.onnx", inputs=MAPPED,
                   image_layout={"rgb": "chw"})
    assert act.inputs == ("obs", "front_image")


@pytest.mark.parametrize(("made", "fields", "says"), [
    ({}, {}, "train.inputs: map each input of the policy to the task's observation: obs (the "
     "state), a camera image (front_image) or a list of state entries; e.g. inputs: {state: obs, "
     "rgb: front_image} (on the command line: --input state=obs --input rgb=front_image)"),
    ({"size": 96}, {"inputs": MAPPED}, "train.inputs: image input 'rgb' fits neither layout; "
     "camera front of task reach-vision-v0 gives 64 x 64 RGB"),
    ({}, {"inputs": MAPPED, "image_layout": {"rgb": "hwc"}}, "train.image_layout: image input "
     "'rgb' is FLOAT ['n', 3, 64, 64], which is not HWC"),
    ({"layout": "hwc"}, {"inputs": MAPPED, "image_range": {"rgb": "0..1"}},
     "train.image_range: image input 'rgb' is uint8"),
    ({}, {"inputs": {"state": "obs", "rgb": "top_image"}}, "train.inputs: task reach-vision-v0 "
     "has no observation tensor of that name; its tensors: obs, front_image"),
    ({}, {"inputs": MAPPED, "image_layout": {"state": "chw"}}, "train.image_layout: no image "
     "input of the policy has that name; its image inputs: rgb"),
    ({}, {"inputs": {"state": "front_image", "rgb": "obs"}}, "train.source: input 'rgb' must "
     "be a float32 tensor of shape (batch, entries)"),
], ids=["unmapped", "camera-size", "stated-layout", "uint8-range", "unknown-camera",
        "layout-of-no-image", "swapped"])
def test_a_policy_that_does_not_fit_the_task_is_one_line(
    tmp_path: Path, spec: TaskSpec, made: dict[str, object], fields: dict[str, object],
    says: str
) -> None:
    foreign_vision_onnx(tmp_path / "policy.onnx", **made)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as refused:
        import_policy(ImportConfig(source="policy.onnx", **fields), spec, base=tmp_path,
                      where=WHERE)
    message = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"pipeline.yaml: {says}"), message


def test_state_inputs_still_map_by_entries_and_torchscript_by_obs(tmp_path: Path) -> None:
    """The earlier mapping forms keep working beside the new ones: a list of entries, and a
    TorchScript policy's input named ``obs`` as the whole state."""
    from tests.fixtures.imported.policies import pd_actions, pd_onnx, pd_torchscript

    spec = get_task("gymnasium:InvertedPendulum-v5")
    obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    pd_onnx(tmp_path / "p.onnx", input_name="policy")
    for inputs in ({"policy": "obs"}, {"policy": ["obs[0]", 1, 2, 3]}):
        imported = import_policy(ImportConfig(source="p.onnx", inputs=inputs), spec,
                                 base=tmp_path, where=WHERE)
        (tmp_path / "s.onnx").write_bytes(imported.onnx)
        np.testing.assert_allclose(load_actor(tmp_path / "s.onnx")(obs), pd_actions(obs),
                                   atol=1e-6)
    pd_torchscript(tmp_path / "p.pt")
    imported = import_policy(ImportConfig(source="p.pt", trust_code=True,
                                          inputs={"obs": "obs"}), spec, base=tmp_path,
                             where=WHERE)
    assert imported.parity_max_abs_diff < 1e-5


def test_the_command_line_names_inputs_as_the_config_does() -> None:
    from flows.cli import build_parser

    args = build_parser().parse_args([
        "validate", "p.onnx", "--suite", "s.yaml", "--input", "a=obs", "--input",
        "b=front_image", "--input", "c=obs[1],3", "--input", "d=joint1.pos",
        "--image-layout", "b=chw", "--image-range", "b=0..255"])
    assert dict(args.input) == {"a": "obs", "b": "front_image", "c": ("obs[1]", 3),
                                "d": ("joint1.pos",)}
    assert args.image_layout == [("b", "chw")] and args.image_range == [("b", "0..255")]
    for bad in (["--input", "rgb"], ["--input", "rgb=a,,b"], ["--image-layout", "rgb=nhwc"]):
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(["validate", "p.onnx", "--suite", "s.yaml", *bad])
        assert stopped.value.code == 2
