"""Credentials in the environment are never recorded: a whole pipeline run is searched for them.

Fake AWS keys and tokens, each holding a unique marker, are planted in the environment of
``flows run`` on the micro reach config, and ``PHYSAI_SIGNING_KEY`` names a real signing key:
the bundles are signed, and the key's contents are searched for like the markers. Every byte
the run leaves under its folder (the MLflow database and artifacts, the Prefect database and
results, the artifact store, logs), the members of every archive there, the process's stdout
and stderr, and every MLflow param and tag of every run, logged model and model version are
searched for the markers. Prefect's stored results are JSON, never pickles. A password in the
MLflow tracking URI is shown neither in run links nor in errors.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "crash_micro.yaml"

pytestmark = pytest.mark.e2e

CliEnv = Callable[..., dict[str, str]]

SECRET_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "PREFECT_API_KEY",
    "GITHUB_TOKEN",
    "HF_TOKEN",
)
"""Credential variables a training machine commonly has set."""


def _blobs(name: str, data: bytes, depth: int = 0) -> Iterator[tuple[str, bytes]]:
    """``data`` and, for zip, tar and gzip containers, every member's bytes, recursively."""
    yield name, data
    if depth > 3:
        return
    if data[:2] == b"\x1f\x8b":
        yield from _blobs(f"{name}!gunzip", gzip.decompress(data), depth + 1)
    elif data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for member in archive.namelist():
                yield from _blobs(f"{name}!{member}", archive.read(member), depth + 1)
    elif data[257:262] == b"ustar":
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for info in archive.getmembers():
                stream = archive.extractfile(info)
                if stream is not None:
                    yield from _blobs(f"{name}!{info.name}", stream.read(), depth + 1)


def _leaks(secrets: dict[str, str], name: str, data: bytes) -> list[str]:
    """``<variable> in <where>`` for each secret found in ``data`` or its members (as UTF-8
    or UTF-16)."""
    needles = {var: value.encode() for var, value in secrets.items()}
    return [f"{var} in {where}" for where, blob in _blobs(name, data)
            for var, needle in needles.items()
            if needle in blob or needle.decode().encode("utf-16-le") in blob]


def test_planted_credentials_are_never_recorded(tmp_path: Path, cli_env: CliEnv) -> None:
    work = tmp_path / "work"
    work.mkdir()
    home = work / ".physai"
    tag = uuid.uuid4().hex.upper()
    secrets = {var: f"PLANTED{i}X{tag}" for i, var in enumerate(SECRET_VARS)}
    key_file, key_body = _signing_key(tmp_path / "keys")
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(CONFIG)], cwd=work,
                          env=cli_env(home, shared_prefect=False, PHYSAI_SIGNING_KEY=str(key_file),
                                      **secrets),
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bundles = [p for p in (home / "store").rglob("*") if p.is_file()
               and p.read_bytes()[257:262] == b"ustar"]
    assert bundles and all(b"bundle.sig" in p.read_bytes() for p in bundles), bundles
    secrets["PHYSAI_SIGNING_KEY (its contents)"] = key_body

    written = {p.relative_to(home).parts[0] for p in home.rglob("*") if p.is_file()}
    assert {"mlflow.db", "prefect", "store", "mlartifacts"} <= written, written
    files = [p for p in work.rglob("*") if p.is_file()]
    assert len(files) > 20, files
    leaks = [leak for path in files
             for leak in _leaks(secrets, str(path.relative_to(work)), path.read_bytes())]
    leaks += _leaks(secrets, "stdout", done.stdout.encode())
    leaks += _leaks(secrets, "stderr", done.stderr.encode())
    leaks += _leaks(secrets, "MLflow params and tags", repr(_mlflow_records(home)).encode())
    assert leaks == []
    results = [json.loads(p.read_bytes()) for p in (home / "prefect" / "storage").iterdir()]
    assert results and {r["metadata"]["serializer"]["type"] for r in results} == {"json"}


def _signing_key(folder: Path) -> tuple[Path, str]:
    """A P-256 private key file the package stage signs with, and its base64 body (one line of
    it long enough to be unique)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir()
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    (folder / "signing.pem").write_bytes(pem)
    return folder / "signing.pem", max(pem.decode().splitlines(), key=len)


def _mlflow_records(home: Path) -> list[object]:
    """Every param and tag of every MLflow run, logged model and model version under ``home``."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = [r for e in experiments for r in client.search_runs([e])]
    models = client.search_logged_models(experiments)
    versions = client.search_model_versions()
    assert len(runs) >= 6 and models and versions, (len(runs), len(models), len(versions))
    records: list[object] = []
    for r in runs:
        records += [r.info.run_name, r.data.params, r.data.tags]
    for m in models:
        records += [m.name, m.params, m.tags]
    for v in versions:
        records += [v.source, v.description, v.tags]
    return records


def test_the_search_finds_secrets_inside_archives(tmp_path: Path) -> None:
    secrets = {"TOKEN": "PLANTEDXSCANNER"}
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("weights.gz", gzip.compress(b"PLANTEDXSCANNER"))
    tar = tmp_path / "bundle.tar"
    with tarfile.open(tar, "w") as archive:
        info = tarfile.TarInfo("policy.npz")
        info.size = len(inner.getvalue())
        archive.addfile(info, io.BytesIO(inner.getvalue()))
    assert b"PLANTEDXSCANNER" not in tar.read_bytes()
    assert _leaks(secrets, "bundle.tar", tar.read_bytes()) == [
        "TOKEN in bundle.tar!policy.npz!weights.gz!gunzip"
    ]
    assert _leaks(secrets, "log", "PLANTEDXSCANNER".encode("utf-16-le")) == ["TOKEN in log"]


def test_credentials_in_the_tracking_uri_are_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from requests.exceptions import ConnectionError as RequestsConnectionError

    from physai_core.errors import TransientError
    from stages.tracking.lineage import LineageRecorder

    secret = "PLANTEDXURIPASSWORD"
    recorder = LineageRecorder(f"https://alice:{secret}@mlflow.example.com:5000/")

    class Client:
        def get_run(self, run_id: str) -> SimpleNamespace:
            return SimpleNamespace(info=SimpleNamespace(experiment_id="7"))

        def search_experiments(self) -> None:
            raise RequestsConnectionError("connection refused")

    recorder._client = Client()  # type: ignore[assignment]
    monkeypatch.setattr("stages.tracking.lineage.time.sleep", lambda _: None)
    assert recorder.run_url("r1") == "https://mlflow.example.com:5000/#/experiments/7/runs/r1"
    with pytest.raises(TransientError) as caught:
        recorder.call("search_experiments")
    assert secret not in str(caught.value) and "mlflow.example.com" in str(caught.value)
