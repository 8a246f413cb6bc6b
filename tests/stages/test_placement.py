"""Where a step runs is decided once (:func:`stages.orchestration.envcall.placed`): in this process,
or in the stage environment its inputs need, through that environment's step of the same name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stages.core.environments import INSIDE_ENV
from stages.orchestration import envcall
from stages.orchestration.stage_table import env_entries
from stages.pipeline.nightly import nightly_scenes
from stages.pipeline.run import run_algorithm
from stages.steps.package import rollout_observations
from stages.steps.validate import validate_scene

PLACED: dict[str, envcall.Placed[Any, Any]] = {
    "train": run_algorithm, "validate-scene": validate_scene,
    "rollout-observations": rollout_observations, "evaluate-suite": nightly_scenes}
"""Every step a stage environment runs for a pipeline or the nightly, by its step name."""


def _step(calls: list[tuple[Any, ...]], environment: str | None) -> envcall.Placed[[int], str]:
    """A step that records where it ran."""
    def where(value: int) -> str | None:
        return environment

    def there(environment: str, value: int) -> str:
        calls.append(("there", environment, value))
        return "there"

    @envcall.placed(where, there)
    def step(value: int) -> str:
        """The step."""
        calls.append(("here", value))
        return "here"

    return step


def test_a_step_no_environment_needs_runs_here() -> None:
    calls: list[tuple[Any, ...]] = []
    step = _step(calls, None)
    assert step(3) == "here" and calls == [("here", 3)]
    assert step.__doc__ == "The step." and step.here(4) == "here"


def test_a_step_runs_here_inside_the_environment_it_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INSIDE_ENV, "isaaclab")
    calls: list[tuple[Any, ...]] = []
    assert _step(calls, "isaaclab")(3) == "here" and calls == [("here", 3)]


def test_a_step_elsewhere_is_sent_to_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSIDE_ENV, raising=False)
    monkeypatch.setenv("PHYSAI_ENV_ISAACLAB_PYTHON", str(tmp_path / "elsewhere" / "bin" / "python"))
    calls: list[tuple[Any, ...]] = []
    assert _step(calls, "isaaclab")(3) == "there" and calls == [("there", "isaaclab", 3)]


def test_where_and_there_take_the_steps_parameters() -> None:
    def where(value: int) -> str | None:
        return None

    def there(environment: str, other: int) -> str:
        return "there"

    def step(value: int) -> str:
        return "here"

    def sends(environment: str, value: int) -> str:
        return "there"

    with pytest.raises(TypeError, match=r"step: where and there take its parameters \(value\)"):
        envcall.Placed(step, where, there)
    with pytest.raises(TypeError, match="take its parameters"):
        envcall.Placed(step, sends, sends)


class _Sent(Exception):
    """What a step would have sent to its environment."""


@pytest.mark.parametrize("step", sorted(PLACED))
def test_every_placed_step_is_sent_by_its_name_with_its_request(
        step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_in(environment: str, stage: str, config: Path, stem: Path, request_body: object,
               extra: list[str], what: str) -> object:
        raise _Sent(environment, stage, config, request_body, extra)

    monkeypatch.setattr(envcall, "_run_in", run_in)
    policy = SimpleNamespace(digest="d" * 64, model_dump=lambda **_: {"digest": "d" * 64})
    pipeline = SimpleNamespace(path=tmp_path / "pipeline.yaml")
    ctx = SimpleNamespace(config_path=pipeline.path, pipeline_run_id="run", scratch=tmp_path)
    # what the environment reads again from the config file (the pipeline, the suite, the
    # suite's first scene) is passed as None: it does not cross
    inputs: dict[str, tuple[Any, ...]] = {
        "train": (None, ctx, "teacher", None), "validate-scene": (None, policy, 2, ctx, None),
        "rollout-observations": (policy, ctx, None), "evaluate-suite": (pipeline, policy, 5, None)}
    requests = {"train": {"stage": "teacher", "dataset": None},
                "validate-scene": {"index": 2, "policy": {"digest": "d" * 64}},
                "evaluate-suite": {"policy": {"digest": "d" * 64}, "seed_offset": 5}}
    with pytest.raises(_Sent) as sent:
        PLACED[step].there("isaaclab", *inputs[step])
    environment, name, config, request, extra = sent.value.args
    assert (environment, name, config) == ("isaaclab", step, pipeline.path)
    assert name in env_entries() and extra == ([] if step == "evaluate-suite" else
                                               ["--run-id", "run"])
    if step == "rollout-observations":
        assert set(request) == {"policy", "out"}
    else:
        assert request == requests[step]
