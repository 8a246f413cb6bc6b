"""The stage table drives the Prefect tasks and the stage-environment runner: every stage has
both, and a stage added to the table gets both with no other edit."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import stages.orchestration.stage_table as table
from flows import stage_tasks as tasks
from stages.artifacts.records import Dataset, EdgeBundle, Policy, SceneResult, SimReport
from stages.orchestration.stage_table import STAGES, EnvEntry, StageDef, env_entries
from stages.pipeline import envrun
from stages.pipeline.config import load_pipeline
from stages.pipeline.run import stage_key

TinyConfig = Callable[..., Path]


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` to write throwaway modules into."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("tableprobe_")]:
        del sys.modules[name]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_stage_has_its_prefect_task(stage: StageDef) -> None:
    made = tasks.stage_task(stage.name)
    assert made is getattr(tasks, f"{stage.name}_task")
    assert made.name == stage.name
    assert made.retries == 2 and made.retry_delay_seconds == [2, 10]
    assert made.persist_result is True and made.result_serializer == "json"
    scenes = ["scenes"] if stage.per_scene else []
    assert list(inspect.signature(made.fn).parameters) == [
        "pipeline", "run_id", *stage.inputs, *scenes]


def test_every_environment_step_of_the_table_is_a_choice_of_the_runner() -> None:
    steps = {e.name for s in STAGES for e in s.env}
    assert steps == {"collect", "train", "validate-scene", "rollout-observations"}
    assert set(env_entries()) == steps | {"evaluate-suite", "validate-suite"}
    with pytest.raises(SystemExit):
        envrun.main(["c.yaml", "--stage", "no-such-step", "--request", "r", "--result", "o"])


def test_cache_keys_are_the_stage_keys_of_the_parents_in_table_order(
    tiny_config: TinyConfig,
) -> None:
    pipeline = load_pipeline(tiny_config())
    policy = Policy.model_construct(digest="p" * 64)
    report = SimReport.model_construct(digest="r" * 64)
    bundle = EdgeBundle.model_construct(digest="b" * 64)
    params = {"pipeline": pipeline, "run_id": "run", "policy": policy, "report": report,
              "bundle": bundle}
    key = tasks.stage_task("promote").cache_key_fn
    assert key is not None
    assert key(None, params) == stage_key(  # type: ignore[arg-type]
        "promote", pipeline, [policy, report, bundle])
    dataset = Dataset.model_construct(digest="d" * 64)
    train = tasks.stage_task("train").cache_key_fn
    assert train is not None
    assert train(None, {"pipeline": pipeline, "run_id": "run",  # type: ignore[arg-type]
                        "dataset": dataset}) == stage_key("train", pipeline, [dataset])
    # The suite's verdict is over its scenes' results: other results, another key.
    suite = tasks.stage_task("validate").cache_key_fn
    assert suite is not None
    keys = {suite(None, {"pipeline": pipeline, "run_id": "run",  # type: ignore[arg-type]
                         "policy": policy, "scenes": [SceneResult.model_construct(
                             scene="nominal", episodes=10, successes=k)]})
            for k in (3, 3, 4)}
    assert len(keys) == 2


def test_a_stage_added_to_the_table_gets_a_task_and_an_environment_step(
    modules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (modules / "tableprobe_distill.py").write_text(
        "import json\n"
        "def distill_here(config, run_id, request):\n"
        "    return json.dumps({'config': config, 'run_id': run_id, **request})\n")
    distill = replace(table.stage_def("train"), name="distill", inputs=("policy",),
                      output="student",
                      env=(EnvEntry("distill", "tableprobe_distill:distill_here"),))
    monkeypatch.setattr(table, "STAGES", (*STAGES, distill))
    monkeypatch.setattr(tasks, "STAGE_TASKS", dict(tasks.STAGE_TASKS))

    made = tasks.stage_task("distill")
    assert made.name == "distill"
    assert list(inspect.signature(made.fn).parameters) == ["pipeline", "run_id", "policy"]

    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(json.dumps({"teacher": "t"}))
    assert envrun.main(["pipeline.yaml", "--stage", "distill", "--request", str(request),
                        "--result", str(result), "--run-id", "RUN"]) == 0
    assert json.loads(result.read_text()) == {
        "config": "pipeline.yaml", "run_id": "RUN", "teacher": "t"}
    with pytest.raises(SystemExit):
        envrun.main(["pipeline.yaml", "--stage", "distill", "--request", str(request),
                     "--result", str(result)])
