"""Suites: scene and suite files loaded, checked against the registries, resolved and pinned.

The top of ``stages.sim``: a suite (:mod:`~stages.sim.suites.suite`) lists scenes with episode
counts and fixed seeds; loading (:mod:`~stages.sim.suites.loading`) reads scene and suite files
and checks them against the task and backend registries
(:mod:`~stages.sim.suites.checks`); the digest (:mod:`~stages.sim.suites.digest`) ties a
success rate to the exact scene files, assets and simulator revision that produced it.

May import every layer of ``stages.sim`` below it (``backends``, ``tasks``, ``env``,
``scenes``) and the layers below ``stages.sim``.
"""
