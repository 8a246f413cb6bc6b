"""The evaluation report as a person reads it, tried as a new user would: ``flows validate``
writes the pipeline's ``report.html`` and prints where it is; the MLflow link is printed only
when a server answers for the run; the page shows each scene's failure modes, how far the failed
episodes missed against the success threshold, and what a policy that sees was shown; every plot
fits a 1,400 px page; the default gate says when it is looser than the pipeline's; the shipped
suites run sequentially without warnings; an unknown config field is answered with the closest
valid name."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flows.cli import main
from flows.console import mlflow_line, report_line, server_answers
from flows.validate_cli import DEFAULT_MIN_SUCCESS, gate_note, pipeline_gates
from physai_core.errors import ConfigError
from stages.evaluation.gates import gate_scenes, sequential_design
from stages.evaluation.plots import beside_seen, sensitivity_plot, success_plot, sweep_plot
from stages.evaluation.report_page import (
    PAGE_WIDTH_IN,
    SUCCESS_MISS,
    ReportView,
    miss_plot,
    miss_summary,
    render_page,
)
from stages.evaluation.rollout import SEEN_WORLDS, VideoSpec, rollout
from stages.evaluation.suite import evaluate_scene
from stages.sections.models import SequentialConfig, ValidateConfig
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.catalog import get_task

ROOT = Path(__file__).resolve().parents[2]
REACH_SUITE = ROOT / "sim_scenes" / "reach" / "suite.yaml"
PENDULUM_SUITE = ROOT / "sim_scenes" / "pendulum" / "suite.yaml"
VISION_SCENE = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"
PX = 1400


def _zero_onnx(path: Path, obs_dim: int, act_dim: int) -> Path:
    """An ONNX policy that never moves: ``actions = obs @ 0``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "K"], ["actions"])], "still",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", act_dim])],
        initializer=[numpy_helper.from_array(np.zeros((obs_dim, act_dim), np.float32), "K")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def project(tmp_path: Path, physai_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder with its own state folder, wide terminal lines."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    return tmp_path


def _planted(scene_name: str = "nominal", worlds: int = 60,
             states_miss: float | None = None) -> tuple[Any, Any]:
    """The reach expert, except that it gives up on targets beyond x = 0.5 m: those episodes
    never come close; the rest succeed. With ``states_miss``, the environment declares the miss
    below which an episode succeeds (its ``success_miss`` capability)."""
    import dataclasses

    from stages.sim.tasks.reach import ReachEnv

    scene = load_scene(ROOT / "sim_scenes" / "reach" / f"{scene_name}.yaml")
    env = ReachEnv(scene, worlds, 3, num_threads=1)
    if states_miss is not None:
        declared = dataclasses.replace(env.capabilities, success_miss=True)
        miss = states_miss

        class StatesMiss(ReachEnv):
            @property
            def capabilities(self) -> Any:
                return declared

            def success_miss(self) -> float:
                return miss

        env = StatesMiss(scene, worlds, 3, num_threads=1)

    def act(obs: np.ndarray) -> np.ndarray:
        action = env.expert_action()
        action[obs[:, 17] > 0.5] = 0.0
        return action

    return env, act


# --- flows validate writes the pipeline's report and says where it is ----------------------


def test_flows_validate_writes_the_report_and_prints_its_path(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _zero_onnx(project / "still.onnx", 23, 7)
    code = main(["validate", str(policy), "--suite", str(REACH_SUITE), "--episodes", "4"])
    out = capsys.readouterr().out
    assert code == 1  # an arm that never moves reaches nothing
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in out.splitlines()
             if ": " in line}
    page = Path(lines["evaluation report"])
    assert page.is_file() and page.name == "report.html", out
    text = page.read_text(encoding="utf-8")
    for heading in ("Suite and simulator", "Scenes", "Gates", 'id="misses"', "Sensitivity",
                    "Rollouts", "failures by mode"):
        assert heading in text, heading
    assert "missed 4" in text  # every scene's four episodes failed by missing
    assert "no success" in text  # and no success places the boundary
    assert "MLflow run: http" not in out  # no server answers here
    assert "no MLflow server answers for it" in out


def test_flows_validate_json_names_the_report_and_its_gate(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _zero_onnx(project / "still.onnx", 23, 7)
    main(["validate", str(policy), "--suite", str(REACH_SUITE), "--episodes", "2", "--json",
          "--min-success", "0.3"])
    body = json.loads(capsys.readouterr().out)
    assert Path(body["report"]).is_file()
    assert body["min_success"] == 0.3 and body["min_success_given"] is True
    assert 'id="misses"' in Path(body["report"]).read_text(encoding="utf-8")


# --- the MLflow link only where a server answers --------------------------------------------


class _Stub(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[tuple[str, type[_Stub]]]:
    """An HTTP server on a free port answering every GET with ``handler.status``."""
    handler = type("Handler", (_Stub,), {"status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_the_link_is_printed_when_the_server_answers_for_the_run(
        stub: tuple[str, type[_Stub]]) -> None:
    url, handler = stub
    link = f"{url}/#/experiments/1/runs/abc"
    assert mlflow_line(link, "abc") == f"MLflow run: {link}"
    handler.status = 401  # a server that wants credentials is there too
    assert mlflow_line(link, "abc") == f"MLflow run: {link}"
    handler.status = 404  # something answers, but not for this run
    assert mlflow_line(link, "abc").startswith("MLflow run abc: no MLflow server answers")


def test_a_refused_or_silent_address_gets_no_link_and_costs_at_most_the_timeout() -> None:
    from tests.support import free_port

    refused = f"http://127.0.0.1:{free_port()}/#/experiments/1/runs/abc"
    assert "http" in mlflow_line(refused, "abc") and not mlflow_line(refused, "abc").startswith(
        "MLflow run: ")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        assert not server_answers(f"http://127.0.0.1:{silent.getsockname()[1]}/", 0.3)
        assert time.monotonic() - start < 2.0
    assert not server_answers("file:///tmp/x") and report_line(None) is None


# --- misses against the success threshold ---------------------------------------------------


def _table(miss: list[float], success: list[bool], failure: list[str] | None = None,
           threshold: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    columns = {"success": np.array(success), "miss": np.array(miss, np.float64),
               "failure": np.array(failure or ["" if s else "missed" for s in success])}
    units = {"miss": "m"}
    if threshold is not None:
        columns[SUCCESS_MISS] = np.full(len(miss), threshold)
        units[SUCCESS_MISS] = "m"
    return columns, units


def test_near_misses_and_never_close_read_differently() -> None:
    near = miss_summary("a", *_table([0.01, 0.02, 0.06, 0.07, 0.09], [1, 1, 0, 0, 0]))
    far = miss_summary("b", *_table([0.01, 0.02, 0.06, 0.5, 0.9], [1, 1, 0, 0, 0]))
    assert near is not None and far is not None
    assert near.boundary == (0.02, 0.06) and near.threshold is None
    assert near.near_far() == (3, 0)  # within twice the closest failure (0.12 m)
    assert far.near_far() == (1, 2)
    stated = miss_summary("c", *_table([0.01, 0.02, 0.06, 0.07, 0.5], [1, 1, 0, 0, 0],
                                       threshold=0.03))
    assert stated is not None and stated.threshold == 0.03 and stated.boundary is None
    assert stated.limit == pytest.approx(0.06) and stated.near_far() == (1, 2)


def test_a_boundary_is_placed_only_where_the_outcomes_place_it() -> None:
    assert miss_summary("all", *_table([0.01, 0.02], [1, 1])) is None  # nothing failed
    none = miss_summary("none", *_table([0.2, 0.3], [0, 0]))
    assert none is not None and none.boundary is None and none.near_far() is None
    overlap = miss_summary("x", *_table([0.05, 0.03], [1, 0]))
    assert overlap is not None and overlap.boundary is None
    fell = miss_summary("fell", *_table([0.0, 0.0, 40.0, 150.0], [1, 1, 0, 0],
                                        ["", "", "fell", "fell"]))
    assert fell is not None and fell.boundary == (0.0, 40.0)
    assert set(fell.failed) == {"fell"} and fell.near_far() == (1, 1)


def test_the_environment_s_threshold_is_recorded_and_drawn() -> None:
    env, act = _planted(worlds=30, states_miss=0.05)
    out = rollout(env, act)
    assert out.episodes is not None and out.units is not None
    assert (out.episodes[SUCCESS_MISS] == 0.05).all() and out.units[SUCCESS_MISS] == "m"
    summary = miss_summary("nominal", out.episodes, out.units)
    assert summary is not None and summary.threshold == 0.05
    assert (summary.succeeded < 0.05).all()
    assert all((v >= 0.05).all() for v in summary.failed.values())
    fig = miss_plot([summary])
    drawn = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert 0.05 in drawn and pytest.approx(0.1) in drawn  # the threshold and the near limit


def test_the_page_shows_each_scene_s_failure_modes_and_misses() -> None:
    env, act = _planted()
    result, out = evaluate_scene(env, act, "nominal", 60)
    assert 0 < result.successes < 60
    gates = gate_scenes(ValidateConfig(suite="s", min_success=0.5), (result,))
    view = ReportView("p.onnx", "suite", "0" * 64, "mujoco", "3", "run", (result,), gates,
                      False)
    page = render_page(view, {"success": success_plot((result,), gates)}, {}, "t",
                       {"nominal": (out.episodes, out.units)})
    failed = 60 - result.successes
    assert f"missed {failed}" in page and "near misses" in page and "never close" in page
    assert "(from the outcomes)" in page
    assert page.count("data:image/png") == 2  # the success plot and the misses
    bare = render_page(view, {}, {}, "t")
    assert "No per-episode records were kept." in bare and 'id="seen"' not in bare


# --- what a policy that sees was shown ------------------------------------------------------


class _Seeing:
    """A policy that reads the front camera and holds still; it remembers what it was given."""

    inputs = ("obs", "front_image")

    def __init__(self) -> None:
        self.given: list[np.ndarray] = []

    def __call__(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        self.given.append(observation["front_image"].copy())
        return np.zeros((len(observation["obs"]), 7), np.float32)


def test_a_seeing_policy_s_frames_are_kept_as_it_was_given_them() -> None:
    spec = get_task("reach-vision-v0")
    scene = load_scene(VISION_SCENE)
    env = spec.make_env(scene, 3, 0)
    act = _Seeing()
    try:
        out = rollout(env, act)
    finally:
        env.close()
    assert out.seen is not None and list(out.seen) == ["front_image"]
    frames = out.seen["front_image"]
    every = -(-scene.config.episode_steps // 8)
    assert frames.shape == (len(range(0, len(act.given), every)), SEEN_WORLDS, 64, 64, 3)
    for i, call in enumerate(range(0, len(act.given), every)):
        assert np.array_equal(frames[i], act.given[call][:SEEN_WORLDS])
    assert frames.any()  # rendered, not blank
    scene_result = _scene("tiny", 0)
    gates = gate_scenes(ValidateConfig(suite="s", min_success=0.5), (scene_result,))
    view = ReportView("p", "s", "0" * 64, "mujoco", "3", None, (scene_result,), gates, False)
    page = render_page(view, {}, {}, "t", None, {"tiny": out.seen})
    assert 'id="seen"' in page and "tiny: front_image, 2 worlds" in page
    env = spec.make_env(scene, 2, 0)
    try:  # a state policy is shown nothing
        assert rollout(env, lambda o: np.zeros((len(o), 7), np.float32)).seen is None
    finally:
        env.close()


def test_the_rollout_gif_shows_the_policy_s_view_beside_the_scene() -> None:
    spec = get_task("reach-vision-v0")
    env = spec.make_env(load_scene(VISION_SCENE), 2, 0)
    try:
        out = rollout(env, _Seeing(), VideoSpec(2, 100, 150, 4, spec.camera))
    finally:
        env.close()
    assert out.frames and out.seen is not None
    seen = out.seen["front_image"]
    assert seen.shape[1] == 2  # the filmed worlds
    joined = beside_seen(out.frames, out.seen)
    assert len(joined) == len(out.frames)
    assert joined[0].shape == (150, 200 + 2 * 128, 3)  # two 64 px views, twice as large
    assert np.array_equal(joined[0][:, :200], out.frames[0])
    view = np.concatenate([seen[0, 0], seen[0, 1]], axis=1)
    assert np.array_equal(joined[0][:128, 200:], np.repeat(np.repeat(view, 2, 0), 2, 1))
    assert not joined[0][128:, 200:].any()
    last = np.concatenate([seen[-1, 0], seen[-1, 1]], axis=1)  # no call after the last frame
    assert np.array_equal(joined[-1][:128, 200:], np.repeat(np.repeat(last, 2, 0), 2, 1))
    assert beside_seen(out.frames, None) is out.frames


# --- every plot fits a 1,400 px page --------------------------------------------------------


def _scene(name: str, factors: int) -> Any:
    from stages.artifacts.records import FactorEffect, SceneResult

    return SceneResult(scene=name, episodes=100, successes=60, success_rate=0.6, ci_low=0.5,
                       ci_high=0.7, mean_return=0.0, mean_final_reward=0.0, factors=tuple(
                           FactorEffect(name=f"factor_{i}", unit="m", effect=0.5, ci_low=0.1,
                                        ci_high=0.9, sd=1.0, mean_failed=1.0,
                                        mean_succeeded=0.0) for i in range(factors)))


@pytest.mark.parametrize("count", [1, 4, 7])
def test_every_plot_fits_a_1400_px_page(count: int) -> None:
    from stages.artifacts.records import SweepCurve

    scenes = tuple(_scene(f"scene_{i}", 6) for i in range(count))
    gates = gate_scenes(ValidateConfig(suite="s", min_success=0.5), scenes)
    summary = miss_summary("m", *_table([0.01, 0.2], [1, 0]))
    assert summary is not None
    curves = tuple(SweepCurve(scene=s.scene, fields=("mass",), points=(
        s.model_copy(update={"sweep": {"mass": 1.0}}),)) for s in scenes)
    for fig in (sensitivity_plot(scenes), success_plot(scenes, gates), sweep_plot(curves),
                miss_plot([summary] * count)):
        width = fig.get_figwidth() * fig.dpi
        assert width <= PX, (fig, width)
    assert PAGE_WIDTH_IN * 100 <= PX
    if count > 3:  # the forest plots wrap onto rows rather than shrink to slivers
        axes = [ax for ax in sensitivity_plot(scenes).axes if ax.get_visible()]
        assert len({round(ax.get_position().y0, 3) for ax in axes}) == -(-count // 3)


# --- the default gate says when it is looser than the pipeline's ----------------------------


def test_the_shipped_pipeline_gates_are_found_and_the_default_is_said_to_be_looser() -> None:
    gates = pipeline_gates(REACH_SUITE)
    assert gates == {str(ROOT / "configs" / "reach.yaml"): 0.8} or \
        set(gates.values()) == {0.8}, gates
    note = gate_note(DEFAULT_MIN_SUCCESS, False, REACH_SUITE)
    assert note is not None and "looser" in note and "--min-success 0.8" in note
    assert gate_note(0.8, True, REACH_SUITE) is None  # the user chose the gate
    assert gate_note(0.9, False, REACH_SUITE) is None  # the default is not looser there


def test_every_shipped_config_gates_above_the_cli_default() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        gate = yaml.safe_load(path.read_text())["validate"]["min_success"]
        assert gate > DEFAULT_MIN_SUCCESS, path  # what DEFAULT_MIN_SUCCESS's doc says


def test_a_suite_no_config_validates_on_gets_a_general_note(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: x\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "broken.yaml").write_text("{not yaml")
    assert pipeline_gates(suite, (tmp_path / "configs",)) == {}
    note = gate_note(0.5, False, suite)
    assert note is not None and "validate.min_success" in note and "looser" not in note


# --- the shipped suites run sequentially without warnings -----------------------------------


def _shipped_suites() -> list[Path]:
    return sorted(p for p in (ROOT / "sim_scenes").glob("*/suite*.yaml")
                  if p.parent.name != "reach_vision")


@pytest.mark.parametrize("suite_path", _shipped_suites(), ids=lambda p: p.parent.name + "/"
                         + p.name)
def test_the_shipped_suites_design_sequential_gates_without_warnings(
        suite_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = yaml.safe_load(suite_path.read_text())
    gates = {DEFAULT_MIN_SUCCESS, *pipeline_gates(suite_path).values()}
    caplog.set_level(logging.INFO, logger="stages.evaluation.gates")
    for threshold in gates:
        cfg = ValidateConfig(suite=str(suite_path), min_success=threshold,
                             sequential=SequentialConfig())
        for entry in data["scenes"]:
            sequential_design(cfg, Path(entry["scene"]).stem, entry["episodes"])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_sequential_gate_worse_than_the_full_count_still_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = ValidateConfig(suite="s", min_success=0.05, sequential=SequentialConfig(chunk=10))
    with caplog.at_level(logging.INFO, logger="stages.evaluation.gates"):
        sequential_design(cfg, "rare", 10)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "more often than" in record.getMessage()
    caplog.clear()
    cfg = ValidateConfig(suite="s", min_success=0.8, sequential=SequentialConfig())
    with caplog.at_level(logging.INFO, logger="stages.evaluation.gates"):
        sequential_design(cfg, "nominal", 100)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "no more often than" in record.getMessage()


@pytest.mark.parametrize("gate", [[], ["--min-success", "0.85"]], ids=["default", "pipeline"])
def test_the_pendulum_suite_runs_sequentially_without_a_warning(
        project: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        gate: list[str]) -> None:
    from tests.fixtures.imported.policies import pd_onnx

    policy = pd_onnx(project / "pd.onnx")
    with caplog.at_level(logging.WARNING):
        assert main(["validate", str(policy), "--suite", str(PENDULUM_SUITE), "--sequential",
                     "--json", *gate]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] is True
    assert not [r for r in caplog.records if r.name.startswith(("stages", "flows"))], \
        caplog.text
    assert "too few" not in captured.err, captured.err


# --- an unknown config field gets the closest valid name ------------------------------------


@pytest.mark.parametrize(("edit", "field", "close"), [
    (lambda d: d["train"].update(iteratons=d["train"].pop("iterations")), "train.iteratons",
     "iterations"),
    (lambda d: d.update(validat=d.pop("validate")), "validat", "validate"),
    (lambda d: d["validate"].update(video_evry=10), "validate.video_evry", "video_every"),
    (lambda d: d["promote"].update(alais="x"), "promote.alais", "alias"),
    (lambda d: d["package"].update(opsett=17), "package.opsett", "opset"),
])
def test_an_unknown_field_is_answered_with_the_closest_name(
        tmp_path: Path, edit: Any, field: str, close: str) -> None:
    from stages.pipeline.config import load_pipeline

    data = yaml.safe_load((ROOT / "configs" / "pendulum.yaml").read_text())
    for section in ("train", "validate"):
        key = "scene" if section == "train" else "suite"
        data[section][key] = str((ROOT / "configs" / data[section][key]).resolve())
    edit(data)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert f"{path}: {field}: unknown field; did you mean {close!r}?" in str(err.value)


def test_a_scene_field_is_answered_too_and_nothing_far_is_suggested(tmp_path: Path) -> None:
    scene = yaml.safe_load((ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text())
    scene["randomization"]["targt_high"] = scene["randomization"].pop("target_high")
    scene["zzz_qqq"] = 1
    path = tmp_path / "nominal.yaml"
    path.write_text(yaml.safe_dump(scene))
    with pytest.raises(ConfigError) as err:
        load_scene(path)
    message = str(err.value)
    assert "randomization.targt_high: unknown field; did you mean 'target_high'?" in message
    assert "zzz_qqq: unknown field (value: 1)" in message


def test_a_suite_s_unknown_field_is_answered_too(tmp_path: Path) -> None:
    data = yaml.safe_load(REACH_SUITE.read_text())
    data["scenes"] = [{**s, "scene": str(REACH_SUITE.parent / s["scene"]), "sed": 1}
                      for s in data["scenes"][:1]]
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert "scenes.0.sed: unknown field; did you mean 'seed'?" in str(err.value)


def test_a_suite_whose_task_a_task_file_defines_runs_with_tasks(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = ROOT / "sim_scenes" / "pusher_reach"
    policy = _zero_onnx(project / "still.onnx", 23, 7)
    args = ["validate", str(policy), "--suite", str(folder / "suite.yaml"), "--episodes", "2"]
    from stages.sim.tasks.catalog import task_names

    if "pusher-reach-v0" not in task_names():  # another test of this process may register it
        assert main(args) == 2
        assert "--tasks FILE" in capsys.readouterr().err
    assert main([*args, "--tasks", str(project / "nope.yaml")]) == 2
    assert "task file not found" in capsys.readouterr().err
    assert main([*args, "--tasks", str(folder / "task.yaml"), "--json", "--sequential"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["task"] == "pusher-reach-v0" and Path(body["report"]).is_file()
