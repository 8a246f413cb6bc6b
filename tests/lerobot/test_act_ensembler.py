"""edge.runtime.ActionChunks's temporal ensembling is LeRobot's ``ACTTemporalEnsembler``: the
same actions, step by step, on the same chunks (ACT's Algorithm 2, weights exp(-m * i) with the
oldest prediction i = 0), for several coefficients, batches of worlds and a reset mid-way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot.policies.act.modeling_act import ACTTemporalEnsembler

from edge.runtime import ActionChunks

TOLERANCE = 1e-5
"""float32 (LeRobot's online mean) against float64 accumulation (ours), on actions of size ~1."""


@pytest.mark.parametrize("coeff", [0.0, 0.01, 0.5])
@pytest.mark.parametrize("size", [1, 4, 10])
def test_ensembled_actions_match_lerobots_ensembler(coeff: float, size: int) -> None:
    worlds, act_dim, steps = 3, 2, 3 * size + 2
    rng = np.random.default_rng(7)
    chunks = rng.standard_normal((steps, worlds, size, act_dim)).astype(np.float32)
    theirs = ACTTemporalEnsembler(coeff, size)
    ours = ActionChunks(size, ensemble=coeff, worlds=worlds)
    for t in range(steps):
        assert ours.due()
        expected = theirs.update(torch.from_numpy(chunks[t])).numpy()
        np.testing.assert_allclose(ours.step(chunks[t]), expected, atol=TOLERANCE, rtol=0)


def test_a_reset_starts_both_afresh() -> None:
    size, worlds, act_dim = 5, 2, 3
    rng = np.random.default_rng(8)
    chunks = rng.standard_normal((12, worlds, size, act_dim)).astype(np.float32)
    theirs = ACTTemporalEnsembler(0.01, size)
    ours = ActionChunks(size, ensemble=0.01, worlds=worlds)
    for t in range(12):
        if t == 7:  # every world starts a new episode, as LeRobot's policy.reset() does
            theirs.reset()
            ours.reset()
        expected = theirs.update(torch.from_numpy(chunks[t])).numpy()
        np.testing.assert_allclose(ours.step(chunks[t]), expected, atol=TOLERANCE, rtol=0)


def test_the_oracle_tells_coefficients_apart() -> None:
    # Ensembling with another coefficient gives other actions: the comparison can fail.
    size = 6
    chunks = np.random.default_rng(9).standard_normal((8, 1, size, 2)).astype(np.float32)
    theirs = ACTTemporalEnsembler(0.01, size)
    ours = ActionChunks(size, ensemble=0.5, worlds=1)
    diffs = [np.abs(ours.step(c) - theirs.update(torch.from_numpy(c)).numpy()).max()
             for c in chunks]
    assert max(diffs) > 1e-2
