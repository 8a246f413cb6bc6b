"""Input the CLI reads besides a config: the environment, a port, a JSON record, a key file.

Each bad one is refused in one line naming where it came from, with exit status 2, before
any state folder, database or log is written; every file is read only up to its bound.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from physai_core.errors import ConfigError, Problem
from stages.core.loading import read_capped, read_json

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "reach_tiny.yaml"


def refused(capsys: pytest.CaptureFixture[str], status: int) -> str:
    """The one line a refusal printed on stderr (exit status 2, nothing on stdout)."""
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert out == "" and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("PHYSAI_SIM_THREADS", "abc", "must be a number of stepping threads, 1 to 1,024"),
    ("PHYSAI_SIM_THREADS", "100000", "must be a number of stepping threads, 1 to 1,024"),
    ("PHYSAI_CAMERA_TILES", "bogus", "must be off, on, auto or a number of processes"),
    ("PHYSAI_CAMERA_TILES", "100000", "must be off, on, auto or a number of processes"),
    ("MLFLOW_TRACKING_URI", "garbage://x", "unknown scheme 'garbage'"),
    ("PHYSAI_STORE", "ftp://host/bucket", "must be a folder or s3://BUCKET/PREFIX"),
    ("PHYSAI_HOME", "FILE", "is a file; the state folder must be a folder"),
])
def test_an_unusable_variable_stops_the_run_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        variable: str, value: str, message: str) -> None:
    home = tmp_path / "state"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PHYSAI_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    if value == "FILE":
        (tmp_path / "a-file").write_text("not a folder")
        value = str(tmp_path / "a-file")
    monkeypatch.setenv(variable, value)
    line = refused(capsys, main(["run", "--direct", str(CONFIG)]))
    assert line.startswith(f"flows: error: environment: {variable}: {message}"), line
    # As every problem shows a value: a long one (a path under pytest's temporary folder,
    # whose length varies with the run) shortened in its middle.
    shown = str(Problem("f", "", value, "m")).partition("(value: ")[2]
    assert line.endswith(f"(value: {shown}\n"), line
    left = ["a-file"] if value.endswith("a-file") else []
    assert sorted(p.name for p in tmp_path.iterdir()) == left


@pytest.mark.parametrize("port", ["0", "99999", "http"])
def test_a_server_port_outside_1_to_65535_is_refused_before_a_server_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        port: str) -> None:
    monkeypatch.setenv("PHYSAI_HOME", str(tmp_path / "state"))
    with pytest.raises(SystemExit) as exit_:
        main(["server", "up", "--prefect-port", port])
    assert exit_.value.code == 2
    assert "argument --prefect-port: " in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_an_engine_report_that_is_a_folder_or_nested_past_reading_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, main(["engine", "report", str(tmp_path)]))
    assert line == f"flows: error: {tmp_path}: cannot read it (IsADirectoryError) " \
                   f"(value: {str(tmp_path)!r})\n"
    deep = tmp_path / "engine_report.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    line = refused(capsys, main(["engine", "report", str(deep)]))
    assert line == f"flows: error: {deep}: not JSON: nested too deeply (value: <text>)\n"


def test_a_yaml_config_nested_past_reading_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text("name: x\nseed: " + "[" * 2000 + "]" * 2000 + "\n")
    line = refused(capsys, main(["check", str(config)]))
    assert line == f"flows: error: {config}: YAML nested too deeply to read (value: <text>)\n"


def test_a_record_is_read_no_further_than_its_bound(tmp_path: Path) -> None:
    record = tmp_path / "info.json"
    record.write_text(json.dumps({"pad": "x" * 5000}))
    assert read_json(record, limit=6000) == {"pad": "x" * 5000}
    with pytest.raises(ConfigError, match=r"info\.json: expected at most .* MiB "
                                          r"\(value: <more than 4096 bytes>\)"):
        read_json(record, limit=4096)

    class Endless:
        """A file that never ends, as /dev/zero does: only a bounded read returns."""

        def __init__(self) -> None:
            self.asked: list[int] = []

        def read(self, size: int) -> bytes:
            self.asked.append(size)
            return b"0" * size

        def __enter__(self) -> Endless:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    endless = Endless()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("builtins.open", lambda *a, **k: endless)
        with pytest.raises(ConfigError, match="expected at most"):
            read_capped(Path("/dev/zero"), 1024)
    assert endless.asked == [1025]


def test_an_api_key_file_past_its_bound_is_refused_unread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "key"
    key.write_text("k" * (1 << 20))
    status = main(["policy", "serve", str(tmp_path / "no-policy.onnx"), "--api-key-file",
                   str(key)])
    line = refused(capsys, status)
    assert f"{key}: --api-key-file: expected at most 0.0625 MiB" in line
    assert "kkkk" not in line


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--alpha", "0", "argument --alpha: must be within (0, 0.5) (value: 0)"),
    ("--alpha", "0.5", "argument --alpha: must be within (0, 0.5) (value: 0.5)"),
    ("--margin", "1", "argument --margin: must be within [0, 1) (value: 1)"),
    ("--margin", "-0.1", "argument --margin: must be within [0, 1) (value: -0.1)"),
])
def test_compare_refuses_its_own_flags_without_naming_another_file(
        capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "a.onnx", "b.onnx", "--suite", "suite.yaml", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"flows compare: error: {message}\n") and "suite.yaml" not in err


@pytest.mark.parametrize(("variable", "value", "shown", "message"), [
    ("MLFLOW_TRACKING_URI", "http://u:pw-Secret9@[::1", "http://<redacted>@[::1",
     "is not a URL: a host's [ without its ]"),
    ("MLFLOW_TRACKING_URI", "postgresql://u:pw Secret9@[::1/db", "postgresql://<redacted>@[::1/db",
     "is not a URL: a host's [ without its ]"),
    ("MLFLOW_TRACKING_URI", "https://u:pw-Secret9@mlflow.example:http/",
     "https://<redacted>@mlflow.example:http/", "is not an http(s) URL naming a host and a port"),
    ("MLFLOW_TRACKING_URI", "http:///mlflow", "http:///mlflow",
     "is not an http(s) URL naming a host and a port"),
    ("MLFLOW_TRACKING_URI", "http://127.0.0.1:0", "http://127.0.0.1:0",
     "is not an http(s) URL naming a host and a port"),
    ("PHYSAI_STORE", "s3://u:pw-Secret9@[::1/prefix", "s3://<redacted>@[::1/prefix",
     "names no S3 bucket"),
    ("PHYSAI_STORE", "s3:///prefix", "s3:///prefix", "names no S3 bucket"),
    ("PHYSAI_S3_ENDPOINT_URL", "http://u:pw-Secret9@[::1:9000", "http://<redacted>@[::1:9000",
     "is not a URL: a host's [ without its ]"),
    ("AWS_ENDPOINT_URL", "http://u:pw-Secret9@[::1:9000", "http://<redacted>@[::1:9000",
     "is not a URL: a host's [ without its ]"),
])
def test_a_malformed_address_is_one_line_without_its_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        variable: str, value: str, shown: str, message: str) -> None:
    home = tmp_path / "state"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for other in ("MLFLOW_TRACKING_URI", "PHYSAI_STORE", "PHYSAI_S3_ENDPOINT_URL",
                  "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    # lineage opens MLflow and the store without the run's environment check; both refuse.
    for argv in (["lineage", "models:/reach@champion"], ["run", "--direct", str(CONFIG)]):
        line = refused(capsys, main(argv))
        assert line.startswith(f"flows: error: environment: {variable}: {message}"), line
        assert line.endswith(f"(value: {shown!r})\n") and "Secret9" not in line
        assert list(tmp_path.iterdir()) == []
