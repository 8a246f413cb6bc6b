"""The bottom layer of ``stages``: config schema and YAML loading, redaction, digests, limits,
settings, file references, action units, crash points and the stage-environment registry.

Imports only :mod:`physai_core`: every layer above may import it.
"""
