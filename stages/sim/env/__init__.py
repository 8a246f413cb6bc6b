"""The batched environment every simulator backend implements, and what all of them share:
observations and cameras, bodies, fixed-length episodes, MuJoCo's worlds, tiled cameras and
overlapped rollouts.

Imports :mod:`stages.sim.scenes` and the layers below ``stages.sim``.
"""
