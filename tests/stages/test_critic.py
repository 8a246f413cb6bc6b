"""The Cosmos critic's client against a local STAND-IN of a Cosmos Reason NIM
(tests/cosmos_standin.py): no machine here can run the model itself."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from stages.evaluation.critic import KEY_ENV, URL_ENV, CriticError, encode_mp4, endpoint, judge
from stages.sections.models import CriticConfig
from tests.cosmos_standin import StandIn, serve_in_thread

pytest.importorskip("av")

FRAMES = [np.full((24, 33, 3), 20 * i, np.uint8) for i in range(6)]
PROMPT = "the task 'reach-v0' in the scene 'nominal'."


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    servers: list[StandIn] = []

    def start(mode: str) -> tuple[str, Path]:
        log = tmp_path / f"requests-{len(servers)}.jsonl"
        server, url = serve_in_thread(mode, log)
        servers.append(server)
        return url, log

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _requests(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _ep(url: str, **kw: object):  # type: ignore[no-untyped-def]
    return endpoint(CriticConfig(url=url, backoff_s=0.01, **kw), env={})  # type: ignore[arg-type]


def test_verdict_comes_back_from_the_video_the_endpoint_decoded(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("pass")
    verdict = judge(_ep(url, model="nvidia/cosmos-reason2-2b"), "nominal",
                    encode_mp4(FRAMES, 12.5), PROMPT)
    assert verdict.passed and verdict.plausible and verdict.task_done
    assert verdict.model == "nvidia/cosmos-reason2-2b"
    assert verdict.reasoning == "stand-in verdict on 6 frames"
    (sent,) = _requests(log)
    assert sent["model"] == "nvidia/cosmos-reason2-2b" and sent["frames"] == 6


def test_a_failed_task_is_a_failed_verdict(standin) -> None:  # type: ignore[no-untyped-def]
    url, _ = standin("fail-scene:nominal")
    verdict = judge(_ep(url), "nominal", encode_mp4(FRAMES, 12.5), PROMPT)
    assert verdict.plausible and not verdict.task_done and not verdict.passed


def test_5xx_is_retried_and_then_answered(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("flaky:2")
    verdict = judge(_ep(url, retries=2), "nominal", encode_mp4(FRAMES, 12.5), PROMPT)
    assert verdict.passed
    assert [r["status"] for r in _requests(log)] == [503, 503, 200]


def test_5xx_past_the_retries_is_one_line(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("down")
    with pytest.raises(CriticError) as err:
        judge(_ep(url, retries=1), "nominal", encode_mp4(FRAMES, 12.5), PROMPT)
    assert str(err.value) == f"Cosmos critic at {url}: HTTP 503 (2 tries)"
    assert len(_requests(log)) == 2


def test_slow_answer_times_out_and_is_retried_then_one_line(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("slow:3")
    start = time.monotonic()
    with pytest.raises(CriticError) as err:
        judge(_ep(url, timeout_s=0.3, retries=1), "nominal", encode_mp4(FRAMES, 12.5), PROMPT)
    assert str(err.value) == f"Cosmos critic at {url}: no answer within 0.3 s (2 tries)"
    assert time.monotonic() - start < 2.5
    assert len(_requests(log)) <= 2  # each slow request is logged only once it is answered


def test_malformed_answer_is_refused_with_one_line_and_not_retried(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("malformed")
    with pytest.raises(CriticError) as err:
        judge(_ep(url), "nominal", encode_mp4(FRAMES, 12.5), PROMPT)
    message = str(err.value)
    assert message == (f"Cosmos critic at {url}, scene 'nominal': malformed answer: no JSON "
                       "object in the message")
    assert "looks fine" not in message and len(_requests(log)) == 1


def test_refused_key_is_not_retried_and_the_key_is_never_shown(standin) -> None:  # type: ignore[no-untyped-def]
    url, log = standin("key:s3cret-key")
    cfg = CriticConfig(url=url, backoff_s=0.01)
    with pytest.raises(CriticError) as err:
        judge(endpoint(cfg, env={KEY_ENV: "wrong-key"}), "nominal", encode_mp4(FRAMES, 12.5),
              PROMPT)
    assert "HTTP 401" in str(err.value) and "wrong-key" not in str(err.value)
    assert len(_requests(log)) == 1
    good = judge(endpoint(cfg, env={KEY_ENV: "s3cret-key"}), "nominal",
                 encode_mp4(FRAMES, 12.5), PROMPT)
    assert good.passed and "s3cret-key" not in good.model_dump_json()
    assert [r["authorized"] for r in _requests(log)] == [True, True]


def test_endpoint_from_the_environment_and_a_missing_one() -> None:
    ep = endpoint(CriticConfig(), env={URL_ENV: "https://nim:8000/",
                                       "PHYSAI_COSMOS_MODEL": "m"})
    assert (ep.url, ep.model, ep.shown) == ("https://nim:8000", "m", "https://nim:8000")
    with pytest.raises(CriticError, match=r"set validate\.critic\.url or PHYSAI_COSMOS_URL"):
        endpoint(CriticConfig(), env={})
    with pytest.raises(CriticError, match="is not an http"):
        endpoint(CriticConfig(), env={URL_ENV: "ftp://nim"})
    with pytest.raises(ValidationError, match="is not an http"):
        CriticConfig(url="ftp://nim")
