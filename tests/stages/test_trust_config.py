"""Config errors carry no foreign bytes, and configs cannot ask for unbounded work.

A file a config names (a suite, scene or task file) that is not one is described by type and
key names, never by a value; the config's own values are quoted with secret-shaped ones
redacted; episodes, steps, worlds, iterations and video size have upper bounds, each refusal
saying what it would cost. Every check goes through ``flows check``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.cli import main
from stages.core.limits import (
    MAX_COLLECT_EPISODES,
    MAX_EPISODE_STEPS,
    MAX_ITERATIONS,
    MAX_ROLLOUT,
    MAX_SWEEP_POINTS,
    MAX_THREADS,
    MAX_VIDEO_SIDE,
    MAX_WORLDS,
)
from stages.core.loading import MAX_YAML_BYTES
from stages.core.redaction import secret_name, secret_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
CREDENTIALS = f"aws_access_key_id: {KEY_ID}\naws_secret_access_key: {SECRET}\n"


def check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``flows check CONFIG`` in this process: its exit status, stdout and stderr."""
    status = main(["check", str(config)])
    out, err = capsys.readouterr()
    return status, out, err


def pipeline(folder: Path, name: str = "reach_tiny.yaml", **sections: Any) -> Path:
    """A copy of a test pipeline config in ``folder``, its file references absolute, with
    ``sections`` merged in (a value of None removes the field)."""
    data = yaml.safe_load((FIXTURES / name).read_text())
    for section in ("collect", "train", "teacher"):
        if isinstance(data.get(section), dict) and "scene" in data[section]:
            data[section]["scene"] = str((FIXTURES / data[section]["scene"]).resolve())
    data["validate"]["suite"] = str((FIXTURES / data["validate"]["suite"]).resolve())
    for section, fields in sections.items():
        if isinstance(fields, dict):
            data.setdefault(section, {}).update(fields)
            data[section] = {k: v for k, v in data[section].items() if v is not None}
        else:
            data[section] = fields
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(status: int, out: str, err: str) -> str:
    """The one line a refusal printed on stderr (exit status 2, nothing on stdout)."""
    assert status == 2, (out, err)
    assert out == ""
    assert err.startswith("flows: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    path = tmp_path / "credentials.yaml"
    path.write_text(CREDENTIALS)
    return path


def test_a_credentials_file_named_as_the_suite_is_said_by_key_names_only(
        tmp_path: Path, credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pipeline(tmp_path, validate={"suite": str(credentials)})
    line = refused(*check(config, capsys))
    assert SECRET not in line and KEY_ID not in line
    assert (f"{credentials}: expected a suite file (a mapping with name, task, scenes), found "
            "a mapping with keys aws_access_key_id, aws_secret_access_key") in line


@pytest.mark.parametrize("where", ["collect.scene", "tasks", "scene of the suite"])
def test_a_credentials_file_named_anywhere_else_is_never_quoted(
        tmp_path: Path, credentials: Path, capsys: pytest.CaptureFixture[str],
        where: str) -> None:
    if where == "collect.scene":
        config = pipeline(tmp_path, collect={"scene": str(credentials)})
    elif where == "tasks":
        config = pipeline(tmp_path, tasks=[str(credentials)])
    else:
        suite = tmp_path / "suite.yaml"
        suite.write_text(yaml.safe_dump({"name": "s", "task": "reach-v0", "scenes": [
            {"scene": str(credentials), "episodes": 5, "seed": 0}]}))
        config = pipeline(tmp_path, validate={"suite": str(suite)})
    line = refused(*check(config, capsys))
    assert SECRET not in line and KEY_ID not in line
    assert f"{credentials}: expected a " in line and "aws_secret_access_key" in line


def test_a_named_file_sharing_some_keys_is_said_by_field_and_type(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file with some of a suite's keys is not a suite: each problem names its field and the
    value's type; none of its strings reaches the message (not even through a message that
    quotes its input, as an unknown task does)."""
    suite = tmp_path / "deploy.yaml"
    suite.write_text(yaml.safe_dump({"name": "prod", "task": "hunter2-correct-horse",
                                     "database_url": "postgres://app:hunter2@db/prod",
                                     "note": "the staple is hunter2"}))
    config = pipeline(tmp_path, validate={"suite": str(suite)})
    line = refused(*check(config, capsys))
    assert "hunter2" not in line and "staple" not in line
    assert f"{suite}: database_url: unknown field (value: <" in line
    assert f"{suite}: task: unknown task" in line and f"{suite}: scenes: Field required" in line


def test_text_that_is_not_yaml_named_as_a_suite_is_not_quoted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ini = tmp_path / "credentials"
    ini.write_text(f"[default]\naws_access_key_id = {KEY_ID}\n"
                   f"aws_secret_access_key = {SECRET}\n")
    config = pipeline(tmp_path, validate={"suite": str(ini)})
    line = refused(*check(config, capsys))
    assert SECRET not in line and KEY_ID not in line and "[default]" not in line
    assert f"{ini}: line 2: expected YAML, found text that is not YAML" in line


def test_an_oversized_file_named_as_a_suite_is_refused_unread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as out:
        out.truncate(MAX_YAML_BYTES + 1)
    config = pipeline(tmp_path, validate={"suite": str(big)})
    line = refused(*check(config, capsys))
    assert f"{big}: expected a YAML file of at most 8 MiB, found 8.0 MiB" in line


@pytest.mark.parametrize(("sections", "field", "secret"), [
    ({"promote": {"model_name": "https://ci:s3cr3t-pass@models.example.com"}},
     "promote.model_name", "s3cr3t-pass"),
    ({"validate": {"api_key": "plain-words-but-a-key"}}, "validate.api_key",
     "plain-words-but-a-key"),
    ({"collect": {"episodes": None, "scene": None, "num_worlds": None,
                  "exploration_noise": None, "source": f"s3://{KEY_ID}:{SECRET}@bucket/demo",
                  "format": "robomimic"}}, "collect.source", SECRET),
    ({"validate": {"critic": {"url": "http://u:hunter2hunter2@critic"}, "video_episodes": 0}},
     "validate.critic.url", "hunter2hunter2"),
])
def test_the_configs_own_secret_shaped_values_are_redacted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any],
        field: str, secret: str) -> None:
    config = pipeline(tmp_path, **sections)
    line = refused(*check(config, capsys))
    assert secret not in line
    assert f"{config}: {field}: " in line


def test_an_ordinary_bad_value_is_still_quoted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pipeline(tmp_path, promote={"model_name": "has spaces"})
    line = refused(*check(config, capsys))
    assert f"{config}: promote.model_name: String should match pattern" in line
    assert "(value: 'has spaces')" in line


@pytest.mark.parametrize(("name", "sections", "field", "value", "cost"), [
    ("reach_tiny.yaml", {"collect": {"num_worlds": MAX_WORLDS + 1}}, "collect.num_worlds",
     MAX_WORLDS + 1, "of simulator state"),
    ("reach_tiny.yaml", {"collect": {"episodes": MAX_COLLECT_EPISODES + 1}},
     "collect.episodes", MAX_COLLECT_EPISODES + 1, "GiB"),
    ("ppo_tiny.yaml", {"train": {"num_worlds": MAX_WORLDS * 2}}, "train.num_worlds",
     MAX_WORLDS * 2, "1.0 GiB of simulator state"),
    ("ppo_tiny.yaml", {"train": {"iterations": MAX_ITERATIONS + 1}}, "train.iterations",
     MAX_ITERATIONS + 1, "simulated steps"),
    ("reach_tiny.yaml", {"validate": {"video_size": [MAX_VIDEO_SIDE + 1, 240]}},
     "validate.video_size", [MAX_VIDEO_SIDE + 1, 240], "MiB"),
    ("ppo_tiny.yaml", {"train": {"steps_per_iteration": 10**8}}, "train.steps_per_iteration",
     10**8, "transitions in memory until its update"),
    ("ppo_tiny.yaml", {"train": {"update_threads": MAX_THREADS + 1}}, "train.update_threads",
     MAX_THREADS + 1, "torch threads"),
    ("ppo_tiny.yaml", {"train": {"resources": {"nodes": 10**6}}}, "train.resources.nodes",
     10**6, "machines joined by torchrun"),
    ("ppo_tiny.yaml", {"train": {"resources": {"nproc_per_node": 10**6}}},
     "train.resources.nproc_per_node", 10**6, "processes started by torchrun"),
])
def test_sizes_past_their_bound_are_refused_with_the_cost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
        sections: dict[str, Any], field: str, value: object, cost: str) -> None:
    config = pipeline(tmp_path, name, **sections)
    line = refused(*check(config, capsys))
    assert f"{config}: {field}: at most " in line
    assert f"(value: {value})" in line or f"(value: {tuple(value)})" in line  # type: ignore[arg-type]
    assert cost in line


@pytest.mark.parametrize(("entry", "field", "cost"), [
    ("episodes", "scenes.0.episodes", "worlds at once"),
    ("episode_steps", "episode_steps", "s at reach-v0's 25 Hz"),
])
def test_a_suite_or_scene_past_its_bound_is_refused_with_the_cost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, field: str,
        cost: str) -> None:
    scene = yaml.safe_load((ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text())
    episodes = 10
    if entry == "episode_steps":
        scene["episode_steps"] = MAX_EPISODE_STEPS + 1
    else:
        episodes = MAX_WORLDS + 1
    scene_file = tmp_path / "nominal.yaml"
    scene_file.write_text(yaml.safe_dump(scene))
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "task": "reach-v0", "scenes": [
        {"scene": "nominal.yaml", "episodes": episodes, "seed": 0}]}))
    config = pipeline(tmp_path, validate={"suite": str(suite)})
    line = refused(*check(config, capsys))
    where = suite if entry == "episodes" else scene_file
    assert f"{where}: {field}: at most " in line and cost in line


@pytest.mark.parametrize(("sections", "field", "value"), [
    ({"train": {"lr": float("inf")}}, "train.lr", "inf"),
    ({"package": {"max_latency_p99_ms": float("inf")}}, "package.max_latency_p99_ms", "inf"),
    ({"package": {"parity_tolerance": float("inf")}}, "package.parity_tolerance", "inf"),
    ({"validate": {"critic": {"timeout_s": float("inf")}}}, "validate.critic.timeout_s",
     "inf"),
])
def test_an_infinite_gate_or_budget_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any],
        field: str, value: str) -> None:
    """An infinite tolerance or latency budget would pass every policy: a gate switched off
    by one YAML token (``.inf``)."""
    line = refused(*check(pipeline(tmp_path, **sections), capsys))
    assert f": {field}: Input should be a finite number (value: {value})" in line


@pytest.mark.parametrize("bound", [1.5, -0.1])
def test_a_scene_gate_outside_zero_to_one_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bound: float) -> None:
    scenes = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
    suite = yaml.safe_load((FIXTURES / scenes["validate"]["suite"]).read_text())
    name = yaml.safe_load((FIXTURES / scenes["validate"]["suite"]).parent.joinpath(
        suite["scenes"][0]["scene"]).read_text())["name"]
    config = pipeline(tmp_path, validate={"scene_min_success": {name: bound}})
    line = refused(*check(config, capsys))
    assert f"validate.scene_min_success.{name}: Input should be " in line
    assert f"(value: {bound})" in line


@pytest.mark.parametrize(("sweep", "message"), [
    ({"friction_scale": [-1.0, 0.5]}, "sweep: friction_scale: -1.0 is not a value of "
     "friction_scale (a scale range (low, high) needs 0 < low <= high)"),
    ({"light_direction_jitter": [10.0, 120.0]}, "sweep: light_direction_jitter: 120.0 is not a "
     "value of light_direction_jitter (Input should be less than or equal to 90)"),
    ({"obs_noise_std": [float("nan")]}, "sweep.obs_noise_std.0: Input should be a finite"),
    ({f: [0.5 + i / 100 for i in range(11)] for f in ("mass_scale", "damping_scale",
                                                       "friction_scale")},
     f"sweep: at most {MAX_SWEEP_POINTS:,}: a grid of 1,331 points, each a whole validation"),
])
def test_a_sweep_is_checked_point_by_point_when_the_suite_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], sweep: dict[str, list[float]],
        message: str) -> None:
    """Before anything runs, not when validation reaches the sweep after training."""
    scene = yaml.safe_load((ROOT / "sim_scenes" / "reach" / "nominal.yaml").read_text())
    scene_file = tmp_path / "nominal.yaml"
    scene_file.write_text(yaml.safe_dump(scene | {"sweep": sweep}))
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "task": "reach-v0", "scenes": [
        {"scene": "nominal.yaml", "episodes": 4, "seed": 0}]}))
    line = refused(*check(pipeline(tmp_path, validate={"suite": str(suite)}), capsys))
    assert line.startswith(f"flows: error: {scene_file}: {message}"), line


def test_the_bounds_admit_every_shipped_and_fixture_config() -> None:
    """The largest sizes the project's own configs, scenes and fixtures ask for are far below
    the bounds."""
    found: dict[str, list[int]] = {}
    for folder in ("configs", "sim_scenes", "tests/fixtures", "examples"):
        for path in (ROOT / folder).rglob("*.yaml"):
            stack = [yaml.safe_load(path.read_text())]
            while stack:
                item = stack.pop()
                if isinstance(item, dict):
                    for key, value in item.items():
                        if isinstance(value, int) and not isinstance(value, bool):
                            found.setdefault(key, []).append(value)
                        elif key == "video_size" and isinstance(value, list):
                            found.setdefault(key, []).extend(value)
                        else:
                            stack.append(value)
                elif isinstance(item, list):
                    stack.extend(item)
    assert max(found["episodes"]) * 100 <= MAX_WORLDS
    assert max(found["episode_steps"]) * 100 <= MAX_EPISODE_STEPS
    assert max(found["num_worlds"]) * 10 <= MAX_WORLDS
    assert max(found["iterations"]) * 100 <= MAX_ITERATIONS
    assert max(found["video_size"]) * 10 <= MAX_VIDEO_SIDE
    rollouts = [w * s for w in found["num_worlds"] for s in found["steps_per_iteration"]]
    assert max(rollouts) * 10 <= MAX_ROLLOUT


@pytest.mark.parametrize(("name", "secret"), [
    ("aws_secret_access_key", True), ("api_key", True), ("password", True),
    ("authToken", True), ("PHYSAI_SIGNING_KEY", True), ("obs_keys", False),
    ("make_kwargs", False), ("model_name", False), ("episodes", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


@pytest.mark.parametrize(("text", "secret"), [
    (KEY_ID, True), (SECRET, True), ("https://user:pw@host/path", True),
    ("ghp_" + "a1B2" * 9, True), ("Bearer abcdefghijkl", True),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", True),
    ("sim_scenes/reach/nominal.yaml", False), ("https://host/path", False),
    ("sha256:" + "0123456789abcdef" * 4, False), ("reach-v0", False),
    ("models:/reach@champion", False),
])
def test_secret_shaped_text(text: str, secret: bool) -> None:
    assert secret_text(text) is secret


def test_a_critic_url_with_a_password_is_refused_before_any_run_writes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The resolved config is written when a run starts: a critic URL with credentials would
    land there, so the config is refused, its value redacted."""
    config = pipeline(tmp_path, validate={"critic": {"url": "https://ci:hunter2hunter2@nim:8000"}})
    line = refused(*check(config, capsys))
    assert f"{config}: validate.critic.url: " in line and "PHYSAI_COSMOS_API_KEY" in line, line
    assert "hunter2hunter2" not in line
    assert not (tmp_path / ".physai").exists()
