"""``flows policy serve``, ``flows validate`` and ``flows compare`` trusted by default: a bundle
runs only when the trust key (``--trust``, else this project's own public key) signed it, or
with ``--allow-unsigned`` and a warning line; the server binds 127.0.0.1 and enforces its
limits from the flags; an unknown model, alias, digest or file is bad input (exit 2) that
writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from tests.fixtures.imported.policies import pd_onnx
from tests.support import free_port, keypair

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "fixtures" / "imported" / "suite.yaml"
TASK = "gymnasium:InvertedPendulum-v5"


def pendulum_bundles(folder: Path) -> dict[str, Path]:
    """The pendulum's PD law packed into ``folder`` three ways: signed with the key "ours",
    with the key "foreign", and unsigned; plus both public keys and ours' private one."""
    from edge.calibration import draw_calibration_set
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target
    from tests.support import policy_manifest_fields

    onnx = pd_onnx(folder / "policy.onnx")
    fields = policy_manifest_fields([0.0] * 4, [1.0] * 4, 1, task=TASK)
    calibration = draw_calibration_set(np.random.default_rng(0).normal(size=(64, 4))
                                       .astype(np.float32), 32)
    ours, ours_pub = keypair(folder, "ours")
    foreign, foreign_pub = keypair(folder, "foreign")
    out = {"ours.pub": ours_pub, "foreign.pub": foreign_pub, "ours.pem": ours}
    for name, key in (("signed", ours), ("foreign", foreign), ("unsigned", None)):
        out[name] = folder / f"{name}.tar"
        pack_policy_bundle(out[name], onnx, calibration, "test", fields,
                           get_target("jetson-agx-orin"), signing_key=key)
    return out


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """:func:`pendulum_bundles`; "ours" is also the key pair under the project's state folder
    (:func:`project`)."""
    return pendulum_bundles(tmp_path_factory.mktemp("bundles"))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            bundles: dict[str, Path]) -> Path:
    """A project folder whose state folder holds the key pair that signed ``signed.tar``."""
    from stages.steps.bundles import project_key_paths

    home = tmp_path / ".physai"
    private, public = project_key_paths(home)
    private.parent.mkdir(parents=True)
    private.write_bytes(bundles["ours.pem"].read_bytes())
    private.chmod(0o600)
    public.write_bytes(bundles["ours.pub"].read_bytes())
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "PREFECT_HOME",
                "PHYSAI_MLFLOW_ARTIFACTS", "PREFECT_LOCAL_STORAGE_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


Serve = Callable[..., tuple[int | None, list[str], int]]


def serve_once(*args: str, call: str = "127.0.0.1",
               key: str | None = None) -> tuple[int | None, list[str], int]:
    """Start ``flows policy serve ARGS --port P``; (exit status, stderr lines, port) once it
    exits, or (None, lines, port) once it says it serves and openpi-client, calling ``call``
    with ``key``, was answered an action of the pendulum (then it is stopped)."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "policy", "serve", *args,
                             "--port", str(port)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    timer = threading.Timer(120, proc.kill)
    timer.start()
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip())
            if line.startswith("serving "):
                client = WebsocketClientPolicy(call, port, api_key=key)
                assert client.get_server_metadata()["task"] == TASK
                action = client.infer({"obs": np.zeros(4, np.float32)})["actions"]
                assert action.shape == (1,)
                proc.terminate()
                proc.wait(timeout=30)
                return None, lines, port
        return proc.wait(timeout=30), lines, port
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()


@pytest.fixture
def serve(project: Path) -> Serve:
    """``serve(*args, key=None)``: :func:`serve_once` in the project folder."""
    return serve_once


def test_serve_refuses_unsigned_and_foreign_bundles_without_a_flag(
    serve: Serve, bundles: dict[str, Path]
) -> None:
    code, lines, _ = serve(str(bundles["unsigned"]))
    assert code == 2 and len(lines) == 1, lines
    assert "unsigned.tar" in lines[0] and "is unsigned" in lines[0], lines
    code, lines, _ = serve(str(bundles["foreign"]))
    assert code == 2 and len(lines) == 1 and "foreign.tar" in lines[0], lines
    code, lines, _ = serve(str(bundles["signed"]), "--trust", str(bundles["foreign.pub"]))
    assert code == 2 and len(lines) == 1 and "signed.tar" in lines[0], lines


def test_serve_runs_a_bundle_the_project_key_signed_on_localhost_with_its_limits(
    serve: Serve, bundles: dict[str, Path]
) -> None:
    code, lines, port = serve(str(bundles["signed"]), "--max-batch", "16",
                              "--max-connections", "3", "--call-timeout", "2")
    assert code is None, lines
    (line,) = lines
    assert f"on ws://127.0.0.1:{port}" in line and "at most 3 clients" in line, line
    assert f"16 observations a call, {16 * 4 * 8 + 64 * 1024} bytes a frame" in line, line
    assert "no API key" in line
    code, lines, _ = serve(str(bundles["foreign"]), "--trust", str(bundles["foreign.pub"]))
    assert code is None and len(lines) == 1, lines


def test_serve_allow_unsigned_and_every_interface_without_a_key_warn_in_one_line_each(
    serve: Serve, bundles: dict[str, Path]
) -> None:
    code, lines, _ = serve(str(bundles["unsigned"]), "--allow-unsigned", "--host", "0.0.0.0",
                           "--allow-no-key")
    assert code is None and len(lines) == 3, lines
    assert lines[0].startswith("warning: serving on 0.0.0.0 with no API key"), lines
    assert lines[1].startswith("warning: ") and "unsigned" in lines[1], lines
    assert lines[2].startswith("serving "), lines


def test_serve_takes_its_api_key_from_a_file_and_never_prints_it(
    serve: Serve, bundles: dict[str, Path], tmp_path: Path
) -> None:
    key = tmp_path / "api.key"
    key.write_text("k-0123456789\n")
    code, lines, _ = serve(str(bundles["signed"]), "--api-key-file", str(key),
                           key="k-0123456789")
    assert code is None and "API key required" in lines[0], lines
    assert "k-0123456789" not in "\n".join(lines)


def test_serve_of_a_stored_bundle_digest_follows_the_same_rule(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.artifacts.records import EdgeBundle, Producer
    from stages.storage.store import LocalStore

    store = LocalStore(project / "store")
    producer = Producer(stage="package", stage_version="1", config_digest="0" * 64,
                        code_revision="test")
    stored = store.publish(bundles["unsigned"], lambda digest, uri: EdgeBundle(
        digest=digest, uri=uri, producer=producer, parents=(), mlflow_run_id=None,
        target="jetson-agx-orin", onnx_digest="0" * 64, opset=17, parity_max_abs_diff=0.0,
        latency_p50_us=1.0, latency_p99_us=1.0, gates=(), passed=True))
    assert main(["policy", "serve", stored.digest]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stored.digest in line and "unsigned" in line, line


def test_validate_takes_a_signed_bundle_and_refuses_an_unsigned_one(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--suite", str(SUITE), "--episodes", "2", "--json"]
    assert main(["validate", str(bundles["signed"]), *args, "--min-success", "0"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["policy_kind"] == "bundle" and len(body["scenes"]) == 2
    assert main(["validate", str(bundles["unsigned"]), *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unsigned.tar" in line and "unsigned" in line, line
    assert main(["compare", str(bundles["signed"]), str(bundles["unsigned"]), *args,
                 "--allow-unsigned"]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "unsigned" in err


def test_unknown_models_aliases_digests_and_files_exit_2_and_write_nothing(
    tmp_path: Path
) -> None:
    """In a folder with no project state, each is one line, exit status 2, and the folder
    stays empty (no .physai/mlflow.db, no store)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PHYSAI_HOME", "MLFLOW_TRACKING_URI", "PHYSAI_STORE")}
    commands = [(ref, ["validate", ref, "--suite", str(SUITE)])
                for ref in ("models:/reach@champoin", "runs:/abc/model", "a" * 64, "nosuch.onnx")]
    commands += [("models:/reach/3", ["compare", "models:/reach/3", "b" * 64, "--suite",
                                      str(SUITE)]),
                 ("sha256:" + "c" * 64, ["policy", "serve", "sha256:" + "c" * 64, "--task",
                                         TASK])]
    for ref, command in commands:
        done = subprocess.run([sys.executable, "-m", "flows.cli", *command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (command, done.stderr[-2000:])
        assert ref in lines[0], lines
        assert list(tmp_path.iterdir()) == [], (command, list(tmp_path.iterdir()))


def test_an_unknown_alias_of_an_existing_registry_is_bad_input(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    project.mkdir(exist_ok=True)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    MlflowClient(uri, registry_uri=uri).create_registered_model("reach")
    capsys.readouterr()
    for ref in ("models:/reach@champoin", "models:/reach/7", "models:/nope@champion"):
        assert main(["validate", ref, "--suite", str(SUITE)]) == 2, ref
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ref in err[0] and "no such model version" in err[0], err
