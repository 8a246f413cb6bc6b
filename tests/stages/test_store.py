from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stages.artifacts import Policy, Producer
from stages.errors import ArtifactNotFoundError, IntegrityError
from stages.hashing import sha256_file
from stages.store import ArtifactStore, LocalStore, S3Store

PRODUCER = Producer(stage="train", stage_version="1", config_digest="c" * 64, code_revision="r")


def make_policy(digest: str, uri: str) -> Policy:
    return Policy(digest=digest, uri=uri, producer=PRODUCER, parents=("p" * 64,), task="reach-v0",
                  obs_dim=23, act_dim=7, hidden=(8,), train_loss=0.1, val_loss=0.2)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint = request.getfixturevalue("s3_endpoint")
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(var, value)
    s3 = S3Store("s3://physai-test/run", cache_dir=tmp_path / "cache", endpoint_url=endpoint)
    s3.client.create_bucket(Bucket="physai-test")
    return s3


def test_publish_then_read_back_verified(store: ArtifactStore, tmp_path: Path) -> None:
    payload = tmp_path / "w.bin"
    payload.write_bytes(os.urandom(3 << 20))
    artifact = store.publish(payload, make_policy)
    assert artifact.digest == sha256_file(payload)
    assert store.has(artifact.digest)
    again = store.get(artifact.digest)
    assert again == artifact
    local = store.open_payload(again)
    assert local.read_bytes() == payload.read_bytes()


def test_large_payload_goes_multipart_on_s3(tmp_path: Path, s3_endpoint: str) -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = S3Store("s3://physai-multi", cache_dir=tmp_path / "cache", endpoint_url=s3_endpoint)
    s3.client.create_bucket(Bucket="physai-multi")
    payload = tmp_path / "big.bin"
    payload.write_bytes(os.urandom(20 << 20))
    artifact = s3.publish(payload, make_policy)
    head = s3.client.head_object(Bucket="physai-multi", Key=f"objects/{artifact.digest[:2]}/"
                                 f"{artifact.digest}")
    assert "-" in head["ETag"], "a 20 MiB payload should be uploaded in parts"
    assert sha256_file(s3.open_payload(artifact)) == artifact.digest


def test_missing_digest_is_not_found(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFoundError):
        store.get("0" * 64)
    assert not store.has("0" * 64)


def test_tampered_payload_fails_verification(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"weights" * 1000)
    artifact = store.publish(payload, make_policy)
    obj = Path(artifact.uri.removeprefix("file://"))
    obj.write_bytes(b"tampered" * 1000)
    with pytest.raises(IntegrityError, match="does not match"):
        store.open_payload(artifact)


def test_crash_before_manifest_leaves_no_visible_artifact(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"abc" * 100)

    def crash(digest: str, uri: str) -> Policy:
        raise KeyboardInterrupt("killed between payload and manifest")

    with pytest.raises(KeyboardInterrupt):
        store.publish(payload, crash)
    digest = sha256_file(payload)
    assert not store.has(digest)
    assert not list((tmp_path / "store").rglob(".tmp-*"))
    artifact = store.publish(payload, make_policy)
    assert store.has(artifact.digest)


def test_unreadable_manifest_is_an_integrity_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store" / "artifacts").mkdir(parents=True)
    (tmp_path / "store" / "artifacts" / f"{'a' * 64}.json").write_text('{"kind": "policy"}')
    with pytest.raises(IntegrityError):
        store.get("a" * 64)
