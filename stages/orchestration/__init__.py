"""How a stage runs: the one table of stages, the context every stage receives, and calling a
stage in its stage environment.

Imports :mod:`stages.sections` and below.
"""
