"""The bottom layer of ``stages``: config schema and YAML loading, digests, limits, settings,
file references, action units, crash points and the stage-environment registry.

Imports only :mod:`physai_core` (and :mod:`edge` for nothing): every layer above may import it.
"""
