"""Scenes and suites: what a validation runs on, read from YAML and resolved.

The bottom of ``stages.sim``: imports the layers below ``stages.sim`` only (it names tasks and
backends by their registered names, checked when a suite is loaded).
"""
