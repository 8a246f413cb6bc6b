"""Prefect flows, tasks, deployments and the ``flows`` CLI. The only package that imports Prefect.

Importing it starts nothing: Prefect itself is imported by the modules that need it.
"""
