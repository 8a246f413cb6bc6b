"""ActionChunks: one action a step from a policy's chunks, by execute-n or ACT's ensembling."""

from __future__ import annotations

import numpy as np
import pytest

from edge.runtime import ActionChunks

K, A, W, T = 4, 2, 3, 11


def _chunks(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(T, W, K, A))


def _weighted_oracle(chunks: np.ndarray, m: float) -> np.ndarray:
    """Step t's action: every chunk queried at s in (t-K, t] predicts step t at row t-s; the
    oldest such prediction weighs exp(0), the next exp(-m), ... (ACT's temporal ensembling)."""
    out = np.zeros((T, W, A))
    for t in range(T):
        preds = [chunks[s, :, t - s] for s in range(max(0, t - K + 1), t + 1)]
        weights = np.exp(-m * np.arange(len(preds)))
        out[t] = sum(w * p for w, p in zip(weights, preds, strict=True)) / weights.sum()
    return out


@pytest.mark.parametrize("m", [0.0, 0.01, 0.7])
def test_ensembling_is_the_weighted_mean_of_every_prediction_for_the_step(m: float) -> None:
    chunks = _chunks()
    runner = ActionChunks(K, ensemble=m, worlds=W)
    got = np.array([runner.step(chunks[t]) for t in range(T)])
    np.testing.assert_allclose(got, _weighted_oracle(chunks, m), atol=1e-6)


def test_execute_runs_n_actions_of_a_chunk_then_queries_again() -> None:
    chunks = _chunks(1)
    runner = ActionChunks(K, execute=3, worlds=W)
    queried, got = [], []
    for t in range(T):
        due = runner.due()
        queried.append(due)
        got.append(runner.step(chunks[t] if due else None))
    assert queried == [t % 3 == 0 for t in range(T)]
    for t in range(T):
        q = t - t % 3
        np.testing.assert_allclose(got[t], chunks[q, :, t - q], atol=1e-6)


def test_a_reset_world_takes_a_fresh_chunk_while_the_others_run_on() -> None:
    chunks = _chunks(2)
    runner = ActionChunks(K, execute=K, worlds=W)
    runner.step(chunks[0])
    runner.reset(np.array([False, True, False]))
    assert runner.due()
    got = runner.step(chunks[1])
    np.testing.assert_allclose(got[0], chunks[0, 0, 1], atol=1e-6)
    np.testing.assert_allclose(got[1], chunks[1, 1, 0], atol=1e-6)
    ens = ActionChunks(K, ensemble=0.01, worlds=W)
    ens.step(chunks[0])
    ens.reset()
    np.testing.assert_allclose(ens.step(chunks[1]), chunks[1, :, 0], atol=1e-6)


def test_the_manifest_spec_round_trips() -> None:
    for runner in (ActionChunks(K, execute=2), ActionChunks(K, ensemble=0.05)):
        again = ActionChunks.from_spec(runner.spec())
        assert again.spec() == runner.spec()


@pytest.mark.parametrize("kwargs", [{}, {"execute": 2, "ensemble": 0.1}, {"execute": K + 1},
                                    {"execute": 0}, {"ensemble": -1.0},
                                    {"ensemble": float("nan")}])
def test_a_chunk_runs_one_way_within_its_size(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="chunk"):
        ActionChunks(K, **kwargs)  # type: ignore[arg-type]


def test_a_chunk_of_the_wrong_shape_or_a_missing_one_is_refused() -> None:
    runner = ActionChunks(K, execute=2, worlds=W)
    with pytest.raises(ValueError, match="expected"):
        runner.step(np.zeros((W, K + 1, A)))
    with pytest.raises(ValueError, match="due"):
        runner.step(None)
