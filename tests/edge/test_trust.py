"""Trusted by default: every bundle is signed (the project's own key when none is named),
whatever runs a bundle refuses one its trust key did not sign unless told ``allow_unsigned``,
a bundle is read once and checked whole before anything is written, bounded in size (sparse
members of every tar format refused), an engine runs only beside its bundle's report, and
engine tolerances and reports are bounded and checked."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from edge.bundle import read_manifest, unpack_bundle, verify_bundle, write_bundle
from edge.errors import BundleError
from edge.pack import SIGNING_KEY_VAR
from edge.runtime import MANIFEST_NAME, RuntimeRefusal, load_bundle
from flows.cli import main

pytest.importorskip("model_signing")

ROOT = Path(__file__).resolve().parents[2]
SCENE = ROOT / "sim_scenes" / "reach" / "nominal.yaml"
TASK = "test-v0"
"""The edge tests' policy's task; driving it on a reach scene is refused after the trust gate."""

Pack = Callable[..., Path]
"""``pack(name, key=None, **manifest_fields)`` (tests/edge/conftest.py)."""


class Opens:
    """Every ``open`` of a file while :meth:`watch` is active (Python's audit events: the
    builtin ``open``, ``Path.open`` and ``tarfile`` alike): (path, wrote)."""

    active: list[tuple[str, bool]] | None = None
    installed = False

    @classmethod
    @contextmanager
    def watch(cls) -> Iterator[list[tuple[str, bool]]]:
        if not cls.installed:
            sys.addaudithook(cls._hook)
            cls.installed = True
        seen: list[tuple[str, bool]] = []
        cls.active = seen
        try:
            yield seen
        finally:
            cls.active = None

    @classmethod
    def _hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or cls.active is None or not isinstance(args[0], str | Path):
            return
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        wrote = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) or any(
            c in mode for c in "wxa+")
        cls.active.append((os.path.abspath(args[0]), wrote))


def _reads(opens: list[tuple[str, bool]], path: Path) -> int:
    return sum(1 for name, wrote in opens if name == str(path.absolute()) and not wrote)


# --------------------------------------------------------------------------- sparse members

SPARSE_REAL = 64 << 20
"""What each sparse member declares: four of them, 256 MiB, in a tar of about 20 KiB."""


def _expanded_sha256(size: int, tail: bytes) -> str:
    digest, zeros = sha256(), bytes(1 << 20)
    left = size - len(tail)
    while left:
        step = min(left, len(zeros))
        digest.update(zeros[:step])
        left -= step
    digest.update(tail)
    return digest.hexdigest()


def _sparse_member(name: str, style: str) -> tuple[tarfile.TarInfo, bytes]:
    """A member whose one stored byte, at the end, expands to :data:`SPARSE_REAL` bytes: PAX
    sparse 1.0 (the map in the data) or 0.1 (the map in the header), as GNU tar writes them."""
    info = tarfile.TarInfo(name)
    if style == "pax-1.0":
        data = f"1\n{SPARSE_REAL - 1}\n1\n".encode().ljust(512, b"\0") + b"x"
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                            "GNU.sparse.name": name, "GNU.sparse.realsize": str(SPARSE_REAL)}
    else:
        data = b"x"
        info.pax_headers = {"GNU.sparse.size": str(SPARSE_REAL), "GNU.sparse.name": name,
                            "GNU.sparse.map": f"{SPARSE_REAL - 1},1"}
    info.size = len(data)
    return info, data


def _sparse_bundle(path: Path) -> Path:
    """A bundle whose manifest lists four sparse members by their expanded size and digest,
    so that a reader which expands them finds every digest right."""
    styles = {"w0": "pax-1.0", "w1": "pax-0.1", "w2": "pax-1.0", "w3": "pax-0.1"}
    digest = _expanded_sha256(SPARSE_REAL, b"x")
    files = {name: {"bytes": SPARSE_REAL, "sha256": digest} for name in styles}
    manifest = json.dumps({"files": files, "format_version": 1}, sort_keys=True,
                          separators=(",", ":")).encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        head = tarfile.TarInfo(MANIFEST_NAME)
        head.size = len(manifest)
        tar.addfile(head, io.BytesIO(manifest))
        for name, style in styles.items():
            info, data = _sparse_member(name, style)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_20_kib_tar_declaring_256_mib_of_sparse_members_is_refused_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _sparse_bundle(tmp_path / "sparse.tar")
    assert bundle.stat().st_size <= 20 * 1024
    with tarfile.open(bundle) as tar:  # what a trusting reader makes of it
        assert sum(m.size for m in tar.getmembers()[1:]) == 256 << 20
    with pytest.raises(BundleError, match=r"member 'w0': sparse file \(PAX header GNU.sparse"):
        verify_bundle(bundle)
    robot = tmp_path / "robot"
    robot.mkdir()
    with pytest.raises(BundleError, match="sparse file"):
        unpack_bundle(bundle, robot / "policy")
    assert list(robot.iterdir()) == []
    with Opens.watch() as opens, pytest.raises(RuntimeRefusal, match="sparse file"):
        load_bundle(bundle, tmp_path / "run", allow_unsigned=True)
    assert list((tmp_path / "run").iterdir()) == []
    assert not [name for name, wrote in opens if wrote], opens
    assert main(["bundle", "verify", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert "sparse file" in err and "\n" not in err


def test_an_old_gnu_sparse_member_is_refused(tmp_path: Path) -> None:
    data = b"x"
    manifest = json.dumps({"files": {"w": {"bytes": 1, "sha256": sha256(data).hexdigest()}},
                           "format_version": 1}).encode()
    path = tmp_path / "gnu.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        head = tarfile.TarInfo(MANIFEST_NAME)
        head.size = len(manifest)
        tar.addfile(head, io.BytesIO(manifest))
        info = tarfile.TarInfo("w")
        info.size, info.type = 1, tarfile.GNUTYPE_SPARSE
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"member 'w': not a regular file \(sparse file\)"):
        verify_bundle(path)


# --------------------------------------------------------------------------- total cap


def test_the_runtime_caps_a_bundles_total_size(
    policy_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = [entry["bytes"] for entry in read_manifest(policy_bundle)["files"].values()]
    cap = max(sizes) + 1  # every member fits alone, not all together
    with pytest.raises(RuntimeRefusal, match=f"bundle total [0-9]+ bytes exceeds the cap {cap}"):
        load_bundle(policy_bundle, tmp_path / "a", max_total_bytes=cap, allow_unsigned=True)
    monkeypatch.setenv("PHYSAI_BUNDLE_MAX_BYTES", str(cap))
    with pytest.raises(RuntimeRefusal, match=f"exceeds the cap {cap}"):
        load_bundle(policy_bundle, tmp_path / "b", allow_unsigned=True)
    with pytest.raises(BundleError, match=f"exceeds the cap {cap}"):
        verify_bundle(policy_bundle)
    assert list((tmp_path / "b").iterdir()) == []
    monkeypatch.setenv("PHYSAI_BUNDLE_MAX_BYTES", "lots")
    with pytest.raises(RuntimeRefusal, match="PHYSAI_BUNDLE_MAX_BYTES: must be a positive"):
        load_bundle(policy_bundle, tmp_path / "c", allow_unsigned=True)


# --------------------------------------------------------------------------- signatures


def test_load_bundle_refuses_an_unsigned_bundle_unless_allowed(
    policy_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeRefusal) as refused:
        load_bundle(policy_bundle, tmp_path / "run", providers=["CPUExecutionProvider"])
    message = str(refused.value)
    assert message.startswith(f"{policy_bundle}: unsigned: ") and "\n" not in message
    assert "--trust" in message and "--allow-unsigned" in message
    assert list((tmp_path / "run").iterdir()) == []
    capsys.readouterr()
    policy = load_bundle(policy_bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    assert policy.obs_dim > 0
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: ") and "unsigned" in warning and "\n" not in warning


def test_the_same_policy_signed_twice_with_one_key_is_the_same_bundle(
    pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Signatures are deterministic (RFC 6979): re-packaging a policy keeps its bundle digest,
    so a re-run registers no new model version; and the bundle still verifies."""
    first, again = pack("first", keys["ours"][0]), pack("again", keys["ours"][0])
    assert first.read_bytes() == again.read_bytes()
    assert pack("foreign", keys["foreign"][0]).read_bytes() != first.read_bytes()
    assert load_bundle(again, tmp_path / "run", providers=["CPUExecutionProvider"],
                       trust_key=keys["ours"][1]).act_dim > 0


def test_signatures_do_not_depend_on_the_process(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Two processes with different string hashing sign the same content to the same bytes
    (model-signing's statement is serialized with sorted keys)."""
    member = tmp_path / "policy.onnx"
    member.write_bytes(b"\x01" * 999)
    code = ("import hashlib, sys; from pathlib import Path; from edge.bundle import _sign; "
            "p = Path(sys.argv[1]); print(hashlib.sha256(_sign(p / 'o.tar', b'{}', "
            "{'policy.onnx': p / 'policy.onnx', 'calibration/obs.npy': p / 'policy.onnx', "
            "'engine.py': p / 'policy.onnx'}, Path(sys.argv[2]))).hexdigest())")
    digests = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(keys["ours"][0])],
                              capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests


def test_a_signed_bundle_runs_only_with_its_signers_key(
    pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    bundle = pack("signed", keys["ours"][0])
    with pytest.raises(RuntimeRefusal, match="signed, but no trust key was given"):
        load_bundle(bundle, tmp_path / "a", providers=["CPUExecutionProvider"])
    with pytest.raises(RuntimeRefusal, match="signed by another key"):
        load_bundle(bundle, tmp_path / "b", providers=["CPUExecutionProvider"],
                    trust_key=keys["foreign"][1])
    assert load_bundle(bundle, tmp_path / "c", providers=["CPUExecutionProvider"],
                       trust_key=keys["ours"][1]).act_dim > 0


def test_nothing_is_written_before_the_signature_checks_out(
    pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    bundle = pack("foreign", keys["foreign"][0])
    work = tmp_path / "run"
    with Opens.watch() as opens, pytest.raises(RuntimeRefusal, match="another key"):
        load_bundle(bundle, work, providers=["CPUExecutionProvider"], trust_key=keys["ours"][1])
    written = [name for name, wrote in opens if wrote and name.startswith(str(work))]
    assert written == [] and list(work.iterdir()) == []
    dest = tmp_path / "unpacked"
    with Opens.watch() as opens, pytest.raises(BundleError, match="another key"):
        unpack_bundle(bundle, dest, trust_key=keys["ours"][1])
    assert [name for name, wrote in opens if wrote and name.startswith(str(tmp_path))] == []


def test_verify_trust_and_against_and_engine_build_read_the_file_once(
    pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path, physai_home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mlflow import MlflowClient

    from stages.core.settings import resolve_settings

    bundle = pack("signed", keys["ours"][0])
    with Opens.watch() as opens:
        assert main(["bundle", "verify", str(bundle), "--trust", str(keys["ours"][1])]) == 0
    assert _reads(opens, bundle) == 1, opens
    uri = resolve_settings().tracking_uri
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model("trusted")
    client.create_model_version("trusted", str(tmp_path), tags={
        "physai.bundle.digest": sha256(bundle.read_bytes()).hexdigest()})
    with Opens.watch() as opens:
        assert main(["bundle", "verify", str(bundle), "--trust", str(keys["ours"][1]),
                     "--against", "models:/trusted/1"]) == 0
    assert _reads(opens, bundle) == 1, opens
    assert "registered: this file is the bundle of models:/trusted/1" in capsys.readouterr().out
    with Opens.watch() as opens:
        code = main(["engine", "build", str(bundle), "--trust", str(keys["ours"][1]),
                     "--out", str(tmp_path / "engine")])
    assert code == (0 if _has_tensorrt() else 2)
    assert _reads(opens, bundle) == 1, opens
    capsys.readouterr()


def test_verify_without_trust_refuses_unless_allow_unsigned_says_the_code_is_not_authenticated(
    pack: Pack, physai_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = pack("unsigned")
    assert main(["bundle", "verify", str(bundle)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "signature NOT checked" in line and str(bundle) in line, line
    assert main(["bundle", "verify", str(bundle), "--allow-unsigned"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("signature:"))
    assert "NOT checked" in line and "not authenticated" in line
    assert "engine.py" in line and "runtime.py" in line and "Dockerfile" in line


def test_the_bundles_own_runtime_refuses_an_unsigned_bundle(
    policy_bundle: Path, keys: dict[str, tuple[Path, Path]], pack: Pack, tmp_path: Path
) -> None:
    robot = tmp_path / "robot"
    robot.mkdir()
    unpack_bundle(policy_bundle, tmp_path / "shipped")
    script = robot / "runtime.py"
    script.write_bytes((tmp_path / "shipped" / "runtime.py").read_bytes())  # alone, as shipped

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *args,
                               "--provider", "CPUExecutionProvider"],
                              capture_output=True, text=True, check=False, cwd=robot)

    refused = run(str(policy_bundle), "--workdir", str(robot / "a"))
    assert refused.returncode == 2 and "unsigned" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (robot / "a").exists() or list((robot / "a").iterdir()) == []
    signed = pack("signed", keys["ours"][0])
    ran = run(str(signed), "--workdir", str(robot / "b"), "--trust", str(keys["ours"][1]))
    assert ran.returncode == 0, ran.stderr
    assert "signed by the key of" in ran.stdout and ran.stderr == ""
    foreign = run(str(signed), "--workdir", str(robot / "c"), "--trust", str(keys["foreign"][1]))
    assert foreign.returncode == 2 and "signed by another key" in foreign.stderr
    allowed = run(str(policy_bundle), "--workdir", str(robot / "d"), "--allow-unsigned")
    assert allowed.returncode == 0 and allowed.stderr.startswith("warning: ")


# --------------------------------------------------------------------------- the project key


def test_the_project_key_is_made_once_private_and_trusted_by_default(
    physai_home: Path, pack: Pack, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.steps.bundles import default_trust_key, project_signing_key

    assert default_trust_key() is None
    private = project_signing_key()
    public = default_trust_key(physai_home)
    assert private.parent == physai_home / "keys" and public is not None
    assert public.parent == private.parent and default_trust_key() == public
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    printed = capsys.readouterr().err
    assert str(private) in printed and str(public) in printed and "PRIVATE KEY" not in printed
    before = private.read_bytes()
    assert project_signing_key() == private and private.read_bytes() == before
    assert capsys.readouterr().err == ""  # printed once, when made
    bundle = pack("project", private)
    assert main(["bundle", "verify", str(bundle), "--trust", str(public)]) == 0
    private.chmod(0o644)
    with pytest.raises(Exception, match="readable by its owner only"):
        project_signing_key()


def test_the_package_stage_signs_with_the_named_key_else_the_projects(
    physai_home: Path, keys: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from stages.core.settings import resolve_settings
    from stages.steps.package import signing_key

    ctx: Any = SimpleNamespace(settings=resolve_settings())
    monkeypatch.delenv(SIGNING_KEY_VAR, raising=False)
    assert signing_key(ctx) == physai_home / "keys" / "bundle-signing.key"
    monkeypatch.setenv(SIGNING_KEY_VAR, str(keys["ours"][0]))
    assert signing_key(ctx) == keys["ours"][0]


# --------------------------------------------------------------------------- flows commands


def test_bundle_drive_refuses_an_unsigned_bundle_given_a_trust_key(
    policy_bundle: Path, keys: dict[str, tuple[Path, Path]], physai_home: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    drive = ["bundle", "drive", str(policy_bundle), "--scene", str(SCENE), "--episodes", "1"]
    assert main([*drive, "--trust", str(keys["ours"][1])]) == 2
    err = capsys.readouterr().err.strip()
    assert "unsigned" in err and "\n" not in err
    assert main(drive) == 2  # no project key yet, no --trust: refused too
    assert "--allow-unsigned" in capsys.readouterr().err
    assert main([*drive, "--allow-unsigned"]) == 2  # past the trust gate, to the task check
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("warning: ") and "unsigned" in warning
    assert error.endswith(f"bundle task {TASK!r} differs from scene 'nominal''s task 'reach-v0'")


def test_bundle_drive_trusts_the_projects_key_by_default(
    physai_home: Path, pack: Pack, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.steps.bundles import project_signing_key

    bundle = pack("ours", project_signing_key())
    capsys.readouterr()
    drive = ["bundle", "drive", str(bundle), "--scene", str(SCENE), "--episodes", "1"]
    assert main(drive) == 2  # past the trust gate, to the task check: the edge tests' task
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error.endswith(f"bundle task {TASK!r} differs from scene 'nominal''s task 'reach-v0'")


def test_allow_unsigned_runs_an_unsigned_bundle_where_the_project_has_a_key(
    physai_home: Path, policy_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The project's key is only the default trust: --allow-unsigned still runs an unsigned
    bundle (with its warning), and asking for both a key and no key is one line."""
    from stages.steps.bundles import project_signing_key

    project_signing_key()
    capsys.readouterr()
    drive = ["bundle", "drive", str(policy_bundle), "--scene", str(SCENE), "--episodes", "1"]
    assert main(drive) == 2
    assert "--allow-unsigned" in capsys.readouterr().err
    assert main([*drive, "--allow-unsigned"]) == 2  # past the trust gate, to the task check
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("warning: ") and "unsigned" in warning
    assert error.endswith(f"bundle task {TASK!r} differs from scene 'nominal''s task 'reach-v0'")
    public = physai_home / "keys" / "bundle-signing.pub"
    assert main([*drive, "--allow-unsigned", "--trust", str(public)]) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert "--allow-unsigned" in error and "--trust" in error


def test_engine_build_refuses_an_unsigned_bundle(
    policy_bundle: Path, keys: dict[str, tuple[Path, Path]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "engine"
    assert main(["engine", "build", str(policy_bundle), "--trust", str(keys["ours"][1]),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "unsigned" in err and "\n" not in err and not out.exists()


def test_ort_engine_cache_lives_outside_the_bundle_folder(
    policy_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge import runtime

    seen: list[Path | None] = []
    real = runtime.open_onnx_session

    def spy(model: Path, providers: list[str] | None = None, *,
            cache_dir: Path | None = None) -> tuple[Any, str]:
        seen.append(cache_dir)
        return real(model, ["CPUExecutionProvider"], cache_dir=cache_dir)

    monkeypatch.setattr(runtime, "open_onnx_session", spy)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = tmp_path / "run"
    load_bundle(policy_bundle, work, allow_unsigned=True)
    (cache,) = seen
    assert cache == tmp_path / "cache" / "physai-runtime" / "tensorrt"
    assert not cache.is_relative_to(work)
    monkeypatch.setenv("PHYSAI_TRT_CACHE", str(tmp_path / "trt"))
    load_bundle(policy_bundle, tmp_path / "run2", allow_unsigned=True)
    assert seen[-1] == tmp_path / "trt"


# --------------------------------------------------------------------------- engine tolerances


def test_a_bundle_cannot_loosen_its_engine_tolerance(
    policy_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "b"
    unpack_bundle(policy_bundle, root)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    files = {name: root / name for name in manifest.pop("files")}
    del manifest["format_version"]
    manifest["engine"]["tolerances"]["int8"] = 0.9
    loose = tmp_path / "loose.tar"
    write_bundle(loose, files, manifest)
    assert main(["bundle", "verify", str(loose)]) == 2
    err = capsys.readouterr().err
    assert "field 'engine.tolerances.int8' is looser than the 0.15" in err


# --------------------------------------------------------------------------- engine reports


def _engine_report(policy_bundle: Path, **changes: Any) -> dict[str, Any]:
    with tarfile.open(policy_bundle) as tar:
        raw = tar.extractfile(MANIFEST_NAME).read()  # type: ignore[union-attr]
    check = {"samples": 256, "max_abs_diff": 1e-3, "tolerance": 2e-2, "passed": True,
             "latency_p50_us": 100.0, "latency_p99_us": 200.0, "latency_iters": 100}
    report = {
        "format": 1, "engine_sha256": "cd" * 32, "engine_bytes": 1000, "precision": "fp16",
        "builder": "python", "build_seconds": 1.0, "command": "trtexec", "tensorrt": "10.3",
        "gpu": "Orin", "compute_capability": "sm_87", "target": "jetson-agx-orin",
        "target_gpu_arch": "sm_87", "target_tensorrt": "10.3",
        "onnx_sha256": json.loads(raw)["files"]["policy.onnx"]["sha256"],
        "manifest_sha256": sha256(raw).hexdigest(), "lineage": {}, "check": check,
        "control_hz": 50.0, "latency_budget_ms": 20.0, "within_budget": True, "passed": True,
    }
    for key, value in changes.items():
        if key.startswith("check_"):
            check[key.removeprefix("check_")] = value
        else:
            report[key] = value
    return report


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"engine_sha256": "x' OR '1'='1"}, "engine_sha256"),
        ({"check_max_abs_diff": 0.5}, "check.passed"),
        ({"check_latency_p99_us": 1e6}, "passed"),
        ({"check_tolerance": 0.9}, "check.tolerance"),
        ({"check_latency_p50_us": float("nan")}, "check.latency_p50_us"),
        ({"gpu": "Orin\nforged: line"}, "gpu"),
        ({"precision": "fp3"}, "precision"),
    ],
)
def test_a_hand_written_engine_report_must_hold_together(
    policy_bundle: Path, tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    from physai_core.errors import ConfigError
    from stages.tracking.engine_record import read_engine_report

    path = tmp_path / "engine_report.json"
    path.write_text(json.dumps(_engine_report(policy_bundle, **changes)))
    with pytest.raises(ConfigError) as caught:
        read_engine_report(path)
    assert f"{path}: {fragment}" in str(caught.value) and caught.value.exit_code == 2


def test_engine_report_refuses_a_digest_that_is_not_one(
    policy_bundle: Path, physai_home: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "engine_report.json"
    path.write_text(json.dumps(_engine_report(policy_bundle)))
    injected = "' OR tags.`physai.bundle.digest` != '"
    assert main(["engine", "report", str(path), "--bundle-digest", injected]) == 2
    err = capsys.readouterr().err.strip()
    assert "--bundle-digest" in err and "\n" not in err
    assert not (physai_home / "mlflow.db").exists()
    unknown = "ab" * 32
    assert main(["engine", "report", str(path), "--bundle-digest", unknown]) == 2
    assert "no bundle with this digest in the store" in capsys.readouterr().err


def test_engine_report_must_come_from_the_named_bundle(
    policy_bundle: Path, physai_home: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stages.artifacts.records import EdgeBundle
    from stages.orchestration.context import open_services

    _, store, _ = open_services()
    stored = store.publish(policy_bundle, lambda digest, uri: _record(EdgeBundle, digest, uri))
    path = tmp_path / "engine_report.json"
    path.write_text(json.dumps(_engine_report(policy_bundle, manifest_sha256="ef" * 32)))
    assert main(["engine", "report", str(path), "--bundle-digest", stored.digest]) == 2
    assert "manifest_sha256" in capsys.readouterr().err
    path.write_text(json.dumps(_engine_report(policy_bundle)))
    assert main(["engine", "report", str(path), "--bundle-digest", stored.digest]) == 0


def _record(kind: Any, digest: str, uri: str) -> Any:
    from stages.artifacts.records import Producer

    producer = Producer(stage="package", stage_version="t", config_digest="t", code_revision="t")
    return kind(digest=digest, uri=uri, producer=producer, parents=(), target="jetson-agx-orin",
                onnx_digest="0" * 64,
                opset=17, parity_max_abs_diff=0.0, latency_p50_us=1.0, latency_p99_us=1.0,
                gates=(), passed=True)


def _has_tensorrt() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None


def test_pull_checks_and_writes_the_same_bytes(
    pack: Pack, keys: dict[str, tuple[Path, Path]], physai_home: Path, tmp_path: Path
) -> None:
    from stages.artifacts.records import EdgeBundle
    from stages.orchestration.context import open_services
    from stages.steps.bundles import pull_bundle

    _, store, _ = open_services()
    stored = store.publish(pack("signed", keys["ours"][0]),
                           lambda digest, uri: _record(EdgeBundle, digest, uri))
    payload = store.open_payload(stored)
    out = tmp_path / "pulled.tar"
    with Opens.watch() as opens:
        pulled = pull_bundle(stored.digest, out, trust_key=keys["ours"][1])
    assert pulled.digest == stored.digest and out.read_bytes() == payload.read_bytes()
    assert _reads(opens, payload) == 2, opens  # the store's digest check, then ours
    refused = tmp_path / "refused.tar"
    with pytest.raises(BundleError, match="signed by another key"):
        pull_bundle(stored.digest, refused, trust_key=keys["foreign"][1])
    assert not refused.exists()
