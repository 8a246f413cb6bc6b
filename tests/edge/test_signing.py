"""Signed bundles: the package path signs with the key ``PHYSAI_SIGNING_KEY`` names (OpenSSF
model-signing, P-256), and ``flows bundle verify --trust`` and the robot runtime given a trust
key refuse every tampered, foreign or unsigned bundle in one line, writing nothing."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytest

from edge.pack import SIGNING_KEY_VAR
from edge.runtime import MANIFEST_NAME, SIGNATURE_NAME, RuntimeRefusal, load_bundle
from flows.cli import main

pytest.importorskip("model_signing")

Pack = Callable[..., Path]
"""``pack(name, key=None, **manifest_fields)`` (tests/edge/conftest.py)."""


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path, "r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


def _write(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _rehashed(members: list[tuple[str, bytes]], edit: Callable[[dict[str, object]], None],
              replace: dict[str, bytes] | None = None) -> list[tuple[str, bytes]]:
    """The members with ``replace``'s bytes swapped in and the manifest edited, its ``files``
    digests recomputed so that every member matches it again; the signature kept as it was."""
    replace = replace or {}
    out = [(n, replace.get(n, d)) for n, d in members]
    manifest = json.loads(dict(out)[MANIFEST_NAME])
    for name, data in out:
        if name in manifest["files"]:
            manifest["files"][name] = {"sha256": sha256(data).hexdigest(), "bytes": len(data)}
    edit(manifest)
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return [(n, raw if n == MANIFEST_NAME else d) for n, d in out]


def _verify(bundle: Path, trust: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["bundle", "verify", str(bundle), "--trust", str(trust)])
    captured = capsys.readouterr()
    return code, captured.err.strip() or captured.out


def test_a_signed_bundle_passes_both_checks(
    pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    private, public = keys["ours"]
    bundle = pack("signed", private)
    assert [n for n, _ in _members(bundle)][-1] == SIGNATURE_NAME
    code, out = _verify(bundle, public, capsys)
    assert code == 0 and f"signature: made with the key of {public}" in out, out
    policy = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         trust_key=public)
    assert not (tmp_path / "run" / SIGNATURE_NAME).exists()
    assert policy.infer(np.zeros(policy.obs_dim, np.float32)).shape == (policy.act_dim,)


def test_the_package_path_signs_with_the_key_the_environment_names(
    pack: Pack, keys: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SIGNING_KEY_VAR, str(keys["ours"][0]))
    names = [n for n, _ in _members(pack("from-env"))]
    assert names[-1] == SIGNATURE_NAME
    monkeypatch.delenv(SIGNING_KEY_VAR)
    assert SIGNATURE_NAME not in [n for n, _ in _members(pack("unsigned"))]


def _set_control_hz(manifest: dict[str, object]) -> None:
    manifest["control_hz"] = 1000.0


TAMPERED = {
    "edited manifest, members re-hashed": lambda m: _rehashed(m, _set_control_hz),
    "swapped member, manifest re-hashed": lambda m: _rehashed(
        m, lambda _: None, {"engine.py": b"print('not the packaged script')\n"}),
    "unsigned": lambda m: [(n, d) for n, d in m if n != SIGNATURE_NAME],
    "traversal": lambda m: [*m[:-1], ("../escape", b"x"), m[-1]],
    "member after the signature": lambda m: [*m, ("late.txt", b"x")],
}


@pytest.mark.parametrize("case", [*TAMPERED, "foreign signature"])
def test_tampered_bundles_are_refused_by_verify_and_the_runtime(
    case: str, pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    private, public = keys["ours"]
    if case == "foreign signature":
        bad = pack("foreign", keys["foreign"][0])
    else:
        bad = _write(tmp_path / "bad.tar", TAMPERED[case](_members(pack("signed", private))))
    code, err = _verify(bad, public, capsys)
    assert code == 2 and "\n" not in err and err.startswith(f"flows: error: {bad}"), err
    before = sorted(tmp_path.iterdir())
    with pytest.raises(RuntimeRefusal) as refused:
        load_bundle(bad, tmp_path / "run", providers=["CPUExecutionProvider"], trust_key=public)
    assert "\n" not in str(refused.value) and str(bad) in str(refused.value)
    assert list((tmp_path / "run").iterdir()) == []
    assert sorted(tmp_path.iterdir()) == sorted([*before, tmp_path / "run"])


def test_refusals_say_why(pack: Pack, keys: dict[str, tuple[Path, Path]], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    private, public = keys["ours"]
    signed = _members(pack("signed", private))
    edited = _write(tmp_path / "edited.tar", _rehashed(signed, _set_control_hz))
    assert "content differs from what was signed (manifest.json)" in _verify(
        edited, public, capsys)[1]
    assert "signed by another key" in _verify(pack("foreign", keys["foreign"][0]), public,
                                              capsys)[1]
    unsigned = _write(tmp_path / "unsigned.tar", TAMPERED["unsigned"](signed))
    assert "the bundle is unsigned and a trust key was given" in _verify(
        unsigned, public, capsys)[1]


def test_a_bad_signing_key_is_named_never_quoted(pack: Pack, tmp_path: Path) -> None:
    from edge.errors import BundleError

    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nSECRETMATERIAL42\n-----END PRIVATE KEY-----\n")
    with pytest.raises(BundleError) as err:
        pack("badkey", key)
    assert str(key) in str(err.value) and "SECRETMATERIAL42" not in str(err.value)
    assert not (tmp_path / "badkey.tar").exists()
