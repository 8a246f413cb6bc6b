"""The five stages a pipeline runs, one module each (collect, train, validate, package,
promote), and getting a bundle onto a robot.

Imports :mod:`stages.training` and below.
"""
