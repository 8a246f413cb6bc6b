from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from physai_core.errors import ArtifactNotFoundError, IntegrityError, TransientError
from stages.artifacts.records import Policy, Producer
from stages.core.hashing import sha256_file
from stages.storage.store import ArtifactStore, LocalStore, S3Store, StoreAccessError
from tests.s3_faults import FAULTS, SWALLOWED, FaultyS3Proxy

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

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


def _die_at(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """Make the store's crash point starting with ``prefix`` interrupt the call."""
    import stages.storage.store

    def crash_point(name: str) -> None:
        if name.startswith(prefix):
            raise KeyboardInterrupt(f"killed at {name}")

    monkeypatch.setattr(stages.storage.store, "crash_point", crash_point)


@pytest.mark.parametrize("point", ["store.write.temp_written.", "store.publish.payload_written."])
def test_crash_before_manifest_leaves_no_visible_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    store = LocalStore(tmp_path / "store")
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"abc" * 100)
    _die_at(monkeypatch, point)
    with pytest.raises(KeyboardInterrupt):
        store.publish(payload, make_policy)
    monkeypatch.undo()
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


S3_ENV = (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
          ("AWS_DEFAULT_REGION", "us-east-1"))


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
              request: pytest.FixtureRequest) -> str:
    """A fresh bucket on the moto server, created directly (no faults); yields its name."""
    import boto3

    for var, value in S3_ENV:
        monkeypatch.setenv(var, value)
    name = "faults-" + request.node.name.replace("_", "-").lower()[:40].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


def direct(endpoint: str) -> S3Client:
    """A client that talks to the endpoint itself, not through a proxy."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def direct_keys(endpoint: str, bucket: str) -> list[str]:
    """Every key in ``bucket``, listed without going through a proxy."""
    listed = direct(endpoint).list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def faulty_store(proxy: FaultyS3Proxy, bucket: str, tmp_path: Path, **kwargs: int) -> S3Store:
    return S3Store(f"s3://{bucket}/run", cache_dir=tmp_path / "cache", endpoint_url=proxy.url,
                   backoff_s=0.05, **kwargs)


def test_publish_and_read_through_injected_faults(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """5xx, dropped connections, lost and truncated responses: every operation still succeeds
    with the right digests, and reads in a fresh cache verify."""
    with FaultyS3Proxy(s3_endpoint, seed=1, rate=0.2) as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path)
        published = []
        for i in range(8):
            payload = tmp_path / f"p{i}.bin"
            payload.write_bytes(os.urandom((i * 97 + 1) << 12))
            artifact = store.publish(payload, make_policy)
            assert artifact.digest == sha256_file(payload)
            store.set_ref(f"runs/{i}", artifact.digest)
            published.append(artifact)
        store.cache_dir = tmp_path / "fresh-cache"
        for i, artifact in enumerate(published):
            assert store.has(artifact.digest)
            assert store.get(artifact.digest) == artifact
            assert sha256_file(store.open_payload(artifact)) == artifact.digest
            assert store.get_ref(f"runs/{i}") == artifact.digest
    assert proxy.injected >= 10, proxy.faults
    assert set(proxy.faults) == set(FAULTS), proxy.faults
    manifests = [k for k in direct_keys(s3_endpoint, s3_bucket) if "/artifacts/" in k]
    assert len(manifests) == len(published)


def test_multipart_upload_and_download_through_injected_faults(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    with FaultyS3Proxy(s3_endpoint, seed=2, rate=0.3) as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path, part_size=5 << 20)
        payload = tmp_path / "big.bin"
        payload.write_bytes(os.urandom(12 << 20))
        artifact = store.publish(payload, make_policy)
        assert sha256_file(store.open_payload(artifact)) == artifact.digest
    assert proxy.injected >= 2, proxy.faults
    head = direct(s3_endpoint).head_object(Bucket=s3_bucket, Key=f"run/objects/"
                                           f"{artifact.digest[:2]}/{artifact.digest}")
    assert head["ETag"].endswith('-3"'), "12 MiB in 5 MiB parts is three parts"
    assert head["Metadata"]["sha256"] == artifact.digest


def test_lost_answer_to_multipart_completion_is_recovered(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """The completion reaches S3 but its answer does not: the retry finds the object whole."""
    with FaultyS3Proxy(s3_endpoint, seed=0, rate=1.0, kinds=("lost-response",),
                       max_in_a_row=1, only=r"^POST .*uploadId=") as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path, part_size=5 << 20)
        payload = tmp_path / "big.bin"
        payload.write_bytes(os.urandom(11 << 20))
        artifact = store.publish(payload, make_policy)
    assert proxy.faults == {"lost-response": 1}
    assert store.has(artifact.digest)
    assert sha256_file(store.open_payload(artifact)) == artifact.digest


def test_truncated_reads_are_read_again(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """botocore does not retry a body cut short after its headers; the store reads it again."""
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"weights" * 1000)
    with FaultyS3Proxy(s3_endpoint, seed=0, rate=1.0, kinds=("truncated",), max_in_a_row=1,
                       only=r"^GET .*/(artifacts|refs)/") as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path)
        artifact = store.publish(payload, make_policy)
        store.set_ref("latest", artifact.digest)
        assert store.get(artifact.digest) == artifact
        assert store.get_ref("latest") == artifact.digest
    assert proxy.faults == {"truncated": 2}


@pytest.mark.parametrize("deny", [r"^", r"^(PUT|POST) "], ids=["everything", "writes"])
def test_access_denied_fails_at_once_with_one_line(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, deny: str
) -> None:
    with FaultyS3Proxy(s3_endpoint, seed=0, rate=0.0, deny=deny) as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path)
        payload = tmp_path / "w.bin"
        payload.write_bytes(b"weights" * 1000)
        start = time.monotonic()
        with pytest.raises(StoreAccessError) as raised:
            store.publish(payload, make_policy)
        seconds = time.monotonic() - start
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert f"s3://{s3_bucket}/run/objects/" in message
    assert re.search("AccessDenied|HTTP 403 Forbidden", message), message
    assert proxy.faults["403"] == 1, "a refusal is not retried"
    assert seconds < 2
    assert direct_keys(s3_endpoint, s3_bucket) == []


def test_missing_bucket_fails_at_once_naming_it(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in S3_ENV:
        monkeypatch.setenv(var, value)
    store = S3Store("s3://no-such-bucket/run", cache_dir=tmp_path / "cache",
                    endpoint_url=s3_endpoint)
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"weights")
    with pytest.raises(StoreAccessError, match=r"s3://no-such-bucket/run/.*NoSuchBucket"):
        store.publish(payload, make_policy)
    with pytest.raises(StoreAccessError, match="NoSuchBucket"):
        store.get("0" * 64)


def test_refused_part_leaves_no_object_and_no_open_upload(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    with FaultyS3Proxy(s3_endpoint, seed=0, rate=0.0, deny=r"^PUT .*partNumber=2") as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path, part_size=5 << 20)
        payload = tmp_path / "big.bin"
        payload.write_bytes(os.urandom(11 << 20))
        with pytest.raises(StoreAccessError, match="AccessDenied"):
            store.publish(payload, make_policy)
    assert proxy.faults["403"] >= 1
    assert direct_keys(s3_endpoint, s3_bucket) == []
    assert not direct(s3_endpoint).list_multipart_uploads(Bucket=s3_bucket).get("Uploads")


def test_exhausted_transient_faults_raise_transient_error(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """An endpoint that keeps answering 503: botocore's and the store's retries run out, and a
    TransientError (which flows retry as a stage) names the object."""
    import boto3
    from botocore.config import Config

    with FaultyS3Proxy(s3_endpoint, seed=0, rate=1.0, kinds=("503",), max_in_a_row=99) as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path, attempts=3)
        store.client = boto3.client("s3", endpoint_url=proxy.url,
                                    config=Config(retries={"total_max_attempts": 1}))
        payload = tmp_path / "w.bin"
        payload.write_bytes(b"weights")
        with pytest.raises(TransientError, match=r"/objects/.* after 3 attempts.*(SlowDown|503)"):
            store.publish(payload, make_policy)
    assert proxy.faults == {"503": 3}
    assert direct_keys(s3_endpoint, s3_bucket) == []


def test_write_that_never_landed_is_caught_before_the_manifest(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """An endpoint that answers 200 to a payload PUT and keeps nothing: the HEAD after the
    upload finds no such object, and no manifest is written."""
    with FaultyS3Proxy(s3_endpoint, seed=0, rate=1.0, kinds=(SWALLOWED,), max_in_a_row=99,
                       only=r"^PUT .*/objects/") as proxy:
        store = faulty_store(proxy, s3_bucket, tmp_path)
        payload = tmp_path / "w.bin"
        payload.write_bytes(b"weights" * 1000)
        with pytest.raises(IntegrityError, match="after upload S3 does not hold"):
            store.publish(payload, make_policy)
    assert proxy.faults == {SWALLOWED: 1}
    assert direct_keys(s3_endpoint, s3_bucket) == []


def test_crash_between_payload_and_manifest_leaves_no_artifact_on_s3(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3Store(f"s3://{s3_bucket}/run", cache_dir=tmp_path / "cache",
                    endpoint_url=s3_endpoint)
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"abc" * 100)
    _die_at(monkeypatch, "store.publish.payload_written.")
    with pytest.raises(KeyboardInterrupt):
        store.publish(payload, make_policy)
    monkeypatch.undo()
    digest = sha256_file(payload)
    assert not store.has(digest)
    with pytest.raises(ArtifactNotFoundError):
        store.get(digest)
    assert direct_keys(s3_endpoint, s3_bucket) == [f"run/objects/{digest[:2]}/{digest}"]
    artifact = store.publish(payload, make_policy)
    assert store.has(artifact.digest)


def test_corrupt_object_on_s3_is_an_integrity_error_not_retried(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    store = S3Store(f"s3://{s3_bucket}/run", cache_dir=tmp_path / "cache",
                    endpoint_url=s3_endpoint)
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"weights" * 1000)
    artifact = store.publish(payload, make_policy)
    store.client.put_object(Bucket=s3_bucket, Key=f"run/objects/{artifact.digest[:2]}/"
                            f"{artifact.digest}", Body=b"tampered" * 1000)
    with pytest.raises(IntegrityError, match="does not match"):
        store.open_payload(artifact)
    assert not (tmp_path / "cache" / "objects" / artifact.digest[:2] / artifact.digest).exists()


def test_missing_payload_is_not_found(store: ArtifactStore, tmp_path: Path) -> None:
    payload = tmp_path / "w.bin"
    payload.write_bytes(b"weights" * 1000)
    artifact = store.publish(payload, make_policy)
    if isinstance(store, S3Store):
        store.client.delete_object(Bucket=store.bucket,
                                   Key=artifact.uri.removeprefix(f"s3://{store.bucket}/"))
    else:
        Path(artifact.uri.removeprefix("file://")).unlink()
    with pytest.raises(ArtifactNotFoundError, match=f"payload of {artifact.digest} missing"):
        store.open_payload(artifact)


@pytest.mark.parametrize("digest", ["../x", "", "ab" * 31, "AB" * 32, "../../etc/passwd"])
def test_a_digest_that_is_not_one_names_no_artifact(tmp_path: Path, digest: str) -> None:
    store = LocalStore(tmp_path / "store")
    (tmp_path / "x.json").write_text("{}")
    assert not store.has(digest)
    with pytest.raises(ArtifactNotFoundError, match="not an artifact digest"):
        store.get(digest)
