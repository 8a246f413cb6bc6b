"""Signed from the first run: with no ``PHYSAI_SIGNING_KEY`` the package stage signs every
bundle with the project's own key, made once under ``PHYSAI_HOME/keys``; the bundle verifies
with its public key, and the runtime runs it trusting that key by default."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from stages.orchestration.context import NullProgress
from stages.pipeline.config import load_pipeline
from stages.pipeline.run import run_direct

pytest.importorskip("model_signing")

TinyConfig = Callable[..., Path]


def test_a_pipelines_bundle_is_signed_with_the_projects_key(
    physai_home: Path, tiny_config: TinyConfig, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from edge.runtime import RuntimeRefusal, load_bundle
    from flows.cli import main
    from stages.orchestration.context import open_services
    from stages.steps.bundles import default_trust_key

    monkeypatch.delenv("PHYSAI_SIGNING_KEY", raising=False)
    result = run_direct(load_pipeline(tiny_config()), NullProgress())
    public = default_trust_key()
    assert public == physai_home / "keys" / "bundle-signing.pub"
    private = public.with_name("bundle-signing.key")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert str(private) in capsys.readouterr().err  # printed once, when made
    _, store, _ = open_services()
    bundle = store.open_payload(result.bundle)
    assert main(["bundle", "verify", str(bundle), "--trust", str(public)]) == 0
    assert f"signature: made with the key of {public}" in capsys.readouterr().out
    policy = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         trust_key=public)
    assert policy.manifest["task"] == "reach-v0"
    with pytest.raises(RuntimeRefusal, match="signed, but no trust key was given"):
        load_bundle(bundle, tmp_path / "refused", providers=["CPUExecutionProvider"])
    secret = private.read_bytes()
    for path in physai_home.rglob("*"):
        if path.is_file() and path != private and path.stat().st_size < 50 << 20:
            assert secret not in path.read_bytes(), f"the private key leaked into {path}"
