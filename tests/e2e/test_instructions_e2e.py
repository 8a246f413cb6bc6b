"""Tasks with instructions, through the remote path: a scene draws each episode's instruction
from its list, ``flows validate ws://...`` sends it as OpenPI's ``prompt``, and a policy that
fails whenever the instruction names a colour it does not know gets the instruction ranked
first among the factors of failure, its interval clear of zero; on a multi-task suite (one
scene per task, each with its own instruction) ``flows validate`` reports per task and
``flows compare`` of two remote policies gives a verdict per task.

The policies are :class:`tests.fixtures.instructions.colour_policy.ColourPolicy` served by
this project's policy server in a thread of the test (the stand-in for a VLA server)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.instructions.colour_policy import ColourPolicy, serve_in_thread

CliEnv = Callable[..., dict[str, str]]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "instructions"

pytestmark = pytest.mark.e2e


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_an_instruction_a_remote_policy_does_not_know_is_ranked_first(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    policy = ColourPolicy(["red", "blue"])
    with serve_in_thread(policy) as uri:
        done = flows("validate", uri, "--suite", str(FIXTURES / "colours_suite.yaml"),
                     "--json", "--min-success", "0", env=env, cwd=tmp_path)
        text = flows("validate", uri, "--suite", str(FIXTURES / "colours_suite.yaml"),
                     "--min-success", "0", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert text.returncode == 0, text.stderr
    assert "instructed 'balance the mauve pole': 0/" in text.stdout, text.stdout
    (scene,) = json.loads(done.stdout)["scenes"]
    # Every instruction of the list was sent, as each episode's prompt.
    assert policy.prompts_seen == {"balance the red pole", "balance the blue pole",
                                   "balance the mauve pole"}
    assert scene["instruction"] == ["balance the red pole", "balance the blue pole",
                                    "balance the mauve pole"]
    rates = {r["instruction"]: r for r in scene["by_instruction"]}
    assert rates["balance the mauve pole"]["success_rate"] == 0.0
    assert rates["balance the red pole"]["success_rate"] == 1.0
    assert sum(r["episodes"] for r in rates.values()) == scene["episodes"] == 30
    top = scene["factors"][0]
    print("instruction ranking:", [(f["name"], round(f["effect"], 3), round(f["ci_low"], 3),
                                    round(f["ci_high"], 3)) for f in scene["factors"]])
    assert top["name"] == "instruction=balance the mauve pole", scene["factors"]
    assert top["effect"] > 0 and top["ci_low"] > 0, top


def test_a_multi_task_suite_reports_and_compares_per_task(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    suite = str(FIXTURES / "multitask_suite.yaml")
    knows_both, knows_red = ColourPolicy(["red", "blue"]), ColourPolicy(["red"])
    with serve_in_thread(knows_both) as a, serve_in_thread(knows_red) as b:
        validated = flows("validate", b, "--suite", suite, "--json", "--min-success", "0.5",
                          env=env, cwd=tmp_path)
        compared = flows("compare", a, b, "--suite", suite, "--json", env=env, cwd=tmp_path)
        shown = flows("compare", a, b, "--suite", suite, env=env, cwd=tmp_path)
    assert validated.returncode == 1, validated.stderr  # the blue task fails its gate
    body = json.loads(validated.stdout)
    rows = {s["name"]: s for s in body["scenes"]}
    assert rows["red-pole"]["instruction"] == "balance the red pole"
    assert rows["red-pole"]["passed"] and rows["red-pole"]["successes"] == 12
    assert rows["blue-pole"]["instruction"] == "balance the blue pole"
    assert not rows["blue-pole"]["passed"] and rows["blue-pole"]["successes"] == 0
    assert body["summary"]["scenes_passed"] == 1 and body["summary"]["scenes"] == 2

    assert compared.returncode == 1, compared.stderr
    answer = json.loads(compared.stdout)
    verdicts = {s["scene"]: s for s in answer["comparison"]["scenes"]}
    print("per-task verdicts:", {k: (v["champion_successes"], v["challenger_successes"],
                                     round(v["p_adjusted"], 5), v["regressed"])
                                 for k, v in verdicts.items()})
    assert not verdicts["red-pole"]["regressed"] and verdicts["blue-pole"]["regressed"]
    assert answer["instructions"] == {"red-pole": "balance the red pole",
                                      "blue-pole": "balance the blue pole"}
    assert shown.returncode == 1, shown.stderr
    assert "balance the blue pole" in shown.stdout and "WORSE" in shown.stdout, shown.stdout
