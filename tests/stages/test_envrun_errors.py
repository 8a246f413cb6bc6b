"""A stage environment's error line reaches the caller's terminal as it is written (the caller
copies the subprocess's output line by line), so it shows no URL credential."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from stages.orchestration.stage_table import EnvEntry
from stages.pipeline import envrun

PASSWORD = "hunter2-envrun"


def _closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_failed_step_prints_its_error_without_the_urls_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "envprobe_remote.py").write_text(
        "from stages.policies.remote import RemotePolicy\n"
        "def connect_here(config, run_id, request):\n"
        "    RemotePolicy(request['uri'], 3, 2, timeout_s=2.0)\n"
        "    return '{}'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(envrun, "env_entries", lambda: {
        "connect": EnvEntry("connect", "envprobe_remote:connect_here", needs_run_id=False)})
    uri = f"ws://physai:{PASSWORD}@127.0.0.1:{_closed_port()}"
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"uri": uri}))

    code = envrun.main(["c.yaml", "--stage", "connect", "--request", str(request),
                        "--result", str(tmp_path / "result.json")])
    sys.modules.pop("envprobe_remote", None)

    err = capsys.readouterr().err
    assert code == 2
    assert "error: remote policy ws://<redacted>@127.0.0.1:" in err
    assert "cannot connect" in err
    assert PASSWORD not in err
    assert not (tmp_path / "result.json").exists()
