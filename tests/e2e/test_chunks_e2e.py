"""Action chunks through the config door: a tiny reach pipeline whose ``train.chunk_size``
clones chunks of actions and whose ``validate.chunk`` ensembles them (ACT's temporal
ensembling) runs collect, train, validate and package; the bundle's manifest says how its
chunks run and the runtime runs them so."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.orchestration.context import NullProgress
from stages.pipeline.config import load_pipeline

TinyConfig = Callable[..., Path]
K = 4

pytestmark = pytest.mark.e2e


def test_a_chunk_pipeline_validates_and_packages_its_chunks(
    physai_home: Path, tiny_config: TinyConfig, tmp_path: Path
) -> None:
    from edge.runtime import load_bundle
    from stages.orchestration.stage_table import STAGES
    from stages.pipeline.session import stage_context, start_pipeline
    from stages.policies.local import load_actor

    config = tiny_config(train={"chunk_size": K},
                         validate={"chunk": {"ensemble": 0.01}, "video_episodes": 0})
    pipeline = load_pipeline(config)
    assert pipeline.config.train.chunk_size == K  # type: ignore[attr-defined]
    ctx = stage_context(pipeline, start_pipeline(pipeline), NullProgress())
    done: dict[str, object] = {"teacher": None}
    for stage in STAGES:
        if stage.name in pipeline.stages and stage.name != "promote":
            done[stage.output] = stage.run(pipeline, ctx,
                                           *(done.get(role) for role in stage.inputs))
    policy, report, bundle = done["policy"], done["report"], done["bundle"]

    act = load_actor(ctx.store.open_payload(policy))  # type: ignore[arg-type]
    assert getattr(act, "chunk_size", None) == K
    assert act(np.zeros((2, pipeline.task.obs_dim), np.float32)).shape == \
        (2, K, pipeline.task.act_dim)
    body = json.loads(ctx.store.open_payload(report).read_text())  # type: ignore[arg-type]
    assert body["chunk"] == {"size": K, "ensemble": 0.01}

    tar = ctx.store.open_payload(bundle)  # type: ignore[arg-type]
    with tarfile.open(tar) as members:
        manifest = json.loads(members.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest["io"]["chunk"] == {"size": K, "ensemble": 0.01}
    assert manifest["io"]["actions"]["shape"] == ["batch", K, pipeline.task.act_dim]
    gates = {g.name: g for g in bundle.gates}  # type: ignore[attr-defined]
    assert gates["parity/dataset"].passed and "whole chunks" in gates["parity/dataset"].detail
    assert "per query (one chunk of 4 actions)" in gates["latency/p99_ms"].detail
    print(f"per-query latency (ONNX Runtime CPU batch 1, chunk of {K}): "
          f"p50 {bundle.latency_p50_us:.1f} us, p99 {bundle.latency_p99_us:.1f} us")  # type: ignore[attr-defined]
    loaded = load_bundle(tar, tmp_path / "robot", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    assert loaded.chunk == {"size": K, "ensemble": 0.01}


def test_a_scene_validated_with_other_chunks_is_validated_again(
    tiny_config: TinyConfig
) -> None:
    """``validate.chunk`` changes what a scene's episodes do, so it is part of the scene's
    cache key: a cached result of other chunks is never reported as this one's."""
    from types import SimpleNamespace

    from stages.pipeline.run import scene_key

    policy: Any = SimpleNamespace(digest="0" * 64)
    keys = [scene_key(load_pipeline(tiny_config(train={"chunk_size": K}, validate=validate)),
                      policy, 0)
            for validate in ({}, {"chunk": {"execute": 2}}, {"chunk": {"execute": 2}},
                             {"chunk": {"ensemble": 0.01}})]
    assert keys[1] == keys[2]
    assert len({keys[0], keys[1], keys[3]}) == 3
