"""The Prefect and MLflow UIs in headless Chromium: after `flows server up`, `flows deploy` and
`flows run`, the pages show the nightly deployment's schedule, the flow run's artifacts, the
registered model's ``@champion``, the logged model's per-scene success metrics, the model
version's gate table and the experiment's runs; each page is saved as a screenshot.

Chromium is Debian's ``chromium`` (``make test`` installs it when it can), driven over the
DevTools protocol with the ``websockets`` client that Prefect already depends on. The
screenshots are also copied to ``.physai/screenshots/`` in the checkout.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from flows.deploy_plan import NIGHTLY_CRON, NIGHTLY_FLOW, NIGHTLY_TIMEZONE
from stages.artifacts.records import SimReport
from tests.conftest import CliEnv
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"
MODEL = "reach-crash"
DEPLOYMENT = CONFIG.stem
SCREENSHOTS = ROOT / ".physai" / "screenshots"
"""Where a person finds the screenshots after ``make test``."""

SCHEDULE_TEXT = {"0 2 * * *": "At 02:00 AM"}[NIGHTLY_CRON]
"""How the Prefect UI words the nightly cron schedule."""

TRAINING_VIEW = "machine_learning"
"""MLflow's "Model training" view (``workflowType``): MLflow 3.17's UI opens an experiment on
the view of this URL parameter, else the one the browser last chose, GenAI in a new browser."""

PREFECT_UI = "/v2"
"""The Prefect UI a browser without a saved preference gets (``/ui-settings``: ``default_ui``)."""

WINDOW = (1600, 1000)
"""Browser viewport, pixels (width, height)."""

PAGE_SECONDS = 30.0
"""Longest wait for a page to show what it should."""

SETTLE_SECONDS = 2.0
"""Time given to drawings (the flow run graph) and animations before a screenshot."""

pytestmark = pytest.mark.e2e


class Browser:
    """Headless Chromium with one page, driven over the Chrome DevTools protocol."""

    def __init__(self, executable: str, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        self._proc = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--lang=en-US",
             "--remote-debugging-port=0", f"--user-data-dir={profile}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=open(profile / "chromium.log", "w"),  # noqa: SIM115
            start_new_session=True,
        )
        self._ids = itertools.count(1)
        try:
            self._ws = connect(self._page_socket(port_file), max_size=None, open_timeout=30)
            self.send("Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=WINDOW[1],
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self._stop()
            raise

    def _page_socket(self, port_file: Path) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            lines = port_file.read_text().split() if port_file.is_file() else []
            if lines:
                with urllib.request.urlopen(f"http://127.0.0.1:{lines[0]}/json/list",
                                            timeout=5) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.2)
        raise RuntimeError("chromium opened no DevTools page in 30 s")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call one DevTools method and return its result (events in between are dropped)."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message["result"])

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression on the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Load ``url``, leaving a blank page first so no text of the last page lingers."""
        self.send("Page.navigate", url="about:blank")
        self.send("Page.navigate", url=url)

    def text(self, row: str | None = None) -> str:
        """The rendered text of the page, or of the table rows that contain ``row``, with
        whitespace runs made single spaces."""
        if row is None:
            return " ".join(str(self.evaluate("document.body?.innerText ?? ''")).split())
        rows = self.evaluate("[...document.querySelectorAll('tr, [role=row]')]"
                             ".map(r => r.innerText)") or []
        return " | ".join(" ".join(r.split()) for r in rows if row in " ".join(r.split()))

    def hover(self, text: str) -> None:
        """Move the mouse onto the innermost element whose whole text is ``text``."""
        point = self.evaluate(
            "(() => { const el = [...document.querySelectorAll('body *')].filter("
            f"e => e.innerText?.trim() === {json.dumps(text)}).pop();"
            " if (!el) return null; const r = el.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        if point is not None:
            self.send("Input.dispatchMouseEvent", type="mouseMoved", x=point[0], y=point[1])

    def screenshot(self, path: Path) -> None:
        """Save what the viewport shows as a PNG, after :data:`SETTLE_SECONDS`."""
        time.sleep(SETTLE_SECONDS)
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Close the connection and end Chromium with all its processes."""
        self._ws.close()
        self._stop()

    def _stop(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


def wait_for(browser: Browser, texts: Sequence[str], row: str | None = None) -> str:
    """Poll the page (or the rows containing ``row``) until every text shows or
    :data:`PAGE_SECONDS` pass; returns what it showed last."""
    deadline = time.monotonic() + PAGE_SECONDS
    while True:
        shown = browser.text(row)
        if all(t in shown for t in texts) or time.monotonic() > deadline:
            return shown
        time.sleep(0.5)


def lacking(page: str, shown: str, texts: Sequence[str]) -> list[str]:
    """A problem naming what ``page`` should show but does not (none when all shows)."""
    missing = [t for t in texts if t not in shown]
    return [f"{page} lacks {missing}; it shows: {shown[:1500]!r}"] if missing else []


def js_number(value: float) -> str:
    """``value`` as JavaScript prints a number (``1`` for 1.0; otherwise the shortest repr)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def sim_report(home: Path, version: dict[str, Any]) -> SimReport:
    """The sim report the model version's tags point at, from the store under ``home``."""
    from stages.storage.store import LocalStore

    tags = {t["key"]: t["value"] for t in version["tags"]}
    report = LocalStore(home / "store").get(tags["physai.sim_report.digest"])
    if not isinstance(report, SimReport):
        raise TypeError(f"{tags['physai.sim_report.digest']} is a {report.kind}, not a sim report")
    return report


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the ``flows`` command line in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def api(url: str, body: dict[str, Any] | None = None) -> Any:
    """GET ``url``, or POST ``body`` to it as JSON; returns the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.load(r)


@pytest.fixture
def chromium() -> str:
    """Path of Debian's ``chromium``; the test skips where it is not installed."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (make test installs it with apt-get "
                    "when run as root)")
    return path


@pytest.fixture
def servers(tmp_path: Path, cli_env: CliEnv) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`flows server up` on free ports; yields the Prefect and MLflow URLs and the environment
    of `flows` commands that report to them. `flows server down` afterwards."""
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    prefect_port, mlflow_port = free_port(), free_port()
    try:
        up = flows("server", "up", "--prefect-port", str(prefect_port),
                   "--mlflow-port", str(mlflow_port), env=env, cwd=tmp_path)
        assert up.returncode == 0, up.stdout + up.stderr
        yield f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}", env
    finally:
        down = flows("server", "down", env=env, cwd=tmp_path)
        assert down.returncode == 0, down.stdout + down.stderr


def test_uis_show_schedule_artifacts_and_champion(
    tmp_path: Path, chromium: str, servers: tuple[str, str, dict[str, str]]
) -> None:
    prefect, mlflow, env = servers
    deploy = flows("deploy", str(CONFIG), "--project-dir", str(ROOT), env=env, cwd=tmp_path)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    run = flows("run", str(CONFIG), env=env, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]

    deployment = api(f"{prefect}/api/deployments/name/{NIGHTLY_FLOW}/{DEPLOYMENT}")
    flow_runs = api(f"{prefect}/api/flow_runs/filter",
                    {"flows": {"name": {"any_": ["pipeline"]}}})
    assert [r["state_type"] for r in flow_runs] == ["COMPLETED"]
    flow_run = flow_runs[0]
    query = urllib.parse.urlencode({"name": MODEL, "alias": "champion"})
    champion = api(f"{mlflow}/api/2.0/mlflow/registered-models/alias?{query}")["model_version"]
    version = champion["version"]
    model_id = champion["source"].removeprefix("models:/")
    run_id = champion["run_id"]
    experiment_id = api(f"{mlflow}/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]["info"][
        "experiment_id"]
    experiment = api(f"{mlflow}/api/2.0/mlflow/experiments/get?experiment_id={experiment_id}")
    kind = {t["key"]: t["value"] for t in experiment["experiment"].get("tags", [])}.get(
        "mlflow.experimentKind")
    assert kind == "custom_model_development", experiment
    report = sim_report(tmp_path / ".physai", champion)

    shots = tmp_path / "screenshots"
    shots.mkdir()
    problems: list[str] = []
    browser = Browser(chromium, tmp_path / "chromium-profile")
    try:
        browser.open(f"{prefect}{PREFECT_UI}/deployments")
        wait_for(browser, [NIGHTLY_FLOW, DEPLOYMENT, SCHEDULE_TEXT], row=NIGHTLY_FLOW)
        browser.hover(SCHEDULE_TEXT)
        tooltip = f"{SCHEDULE_TEXT} ({NIGHTLY_TIMEZONE})"
        shown = wait_for(browser, [tooltip])
        browser.screenshot(shots / "prefect-deployments.png")
        problems += lacking("deployments page", shown, [tooltip])
        problems += lacking(f"the {NIGHTLY_FLOW} row", browser.text(NIGHTLY_FLOW),
                            [DEPLOYMENT, "Active", SCHEDULE_TEXT])

        browser.open(f"{prefect}{PREFECT_UI}/deployments/deployment/{deployment['id']}")
        expected = [DEPLOYMENT, NIGHTLY_FLOW, "Schedules", SCHEDULE_TEXT, "Next Run",
                    "Concurrency Limit 1"]
        shown = wait_for(browser, expected)
        browser.screenshot(shots / "prefect-nightly-deployment.png")
        problems += lacking("nightly deployment page", shown, expected)

        browser.open(f"{prefect}{PREFECT_UI}/runs/flow-run/{flow_run['id']}?tab=Artifacts")
        expected = [flow_run["name"], "Completed", f"{MODEL}-sim-report", f"{MODEL}-summary",
                    f"{MODEL}-mlflow-run", f"{MODEL}-evaluation-report"]
        shown = wait_for(browser, expected)
        browser.screenshot(shots / "prefect-flow-run-artifacts.png")
        problems += lacking("flow run page", shown, expected)

        browser.open(f"{mlflow}/#/models/{MODEL}")
        expected = [f"Version {version}", "@ champion"]
        shown = wait_for(browser, expected, row=f"Version {version}")
        browser.screenshot(shots / "mlflow-model-champion.png")
        problems += lacking(f"the version {version} row", shown, expected)

        browser.open(f"{mlflow}/#/experiments/{experiment_id}/models/{model_id}")
        expected = ["Metrics (", "Status Ready", f"Model versions {MODEL} v{version}"]
        rates = {f"{s.scene}/{stat}": getattr(s, stat) for s in report.scenes
                 for stat in ("success_rate", "ci_low", "ci_high")}
        shown = wait_for(browser, [*expected, *rates])
        browser.screenshot(shots / "mlflow-logged-model-metrics.png")
        problems += lacking("logged model page", shown, expected)
        for key, value in rates.items():
            problems += lacking(f"the {key} metric row", browser.text(key) or shown,
                                [f"{key} - promote {js_number(value)}"])

        browser.open(f"{mlflow}/#/models/{MODEL}/versions/{version}")
        expected = ["Gates passed", "gate measured threshold result",
                    *(f"{g.name} (" for g in report.gates)]
        shown = wait_for(browser, expected)
        browser.screenshot(shots / "mlflow-model-version-gates.png")
        problems += lacking("model version page", shown, expected)

        browser.open(f"{mlflow}/#/experiments/{experiment_id}?workflowType={TRAINING_VIEW}")
        expected = ["Run Name", f"{MODEL}-pipeline", "matching runs"]
        shown = wait_for(browser, expected)
        landed = str(browser.evaluate("location.hash"))
        browser.screenshot(shots / "mlflow-experiment-runs.png")
        problems += lacking("experiment page", shown, expected)
        if not landed.startswith(f"#/experiments/{experiment_id}/runs") or "Token Usage" in shown:
            problems.append(f"experiment page opened on {landed}, not its runs: {shown[:500]!r}")

        page = tmp_path / "report.html"  # the evaluation report, as MLflow serves it
        query = urllib.parse.urlencode({"path": "report.html", "run_uuid": report.mlflow_run_id})
        with urllib.request.urlopen(f"{mlflow}/get-artifact?{query}", timeout=30) as answer:
            page.write_bytes(answer.read())
        browser.open(page.as_uri())
        expected = ["validation on suite", "Suite and simulator", report.suite_digest, "Scenes",
                    "Gates", "Sensitivity", "Rollouts", *(s.scene for s in report.scenes),
                    *(g.name for g in report.gates)]
        shown = wait_for(browser, expected)
        browser.screenshot(shots / "evaluation-report.png")
        problems += lacking("evaluation report", shown, expected)
        images = browser.evaluate(
            "Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
        filmed = sum(s.video_digest is not None for s in report.scenes)
        if len(images) < 1 + filmed or not all(images):
            problems.append(f"evaluation report images (plot + {filmed} GIFs): {images}")
    finally:
        browser.close()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*.png"):
            shutil.copy2(shot, SCREENSHOTS / shot.name)

    assert not problems, "\n".join([*problems, f"screenshots: {SCREENSHOTS}"])
