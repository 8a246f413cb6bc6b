"""Judging a policy: the rollout engine (rollout.py), a policy over a scene, a suite and its
sweeps (suite.py), the gates (gates.py), the report's plots and its MLflow run (plots.py,
reporting.py); success statistics, sequential gates, sensitivity, challenger against champion,
the Cosmos critic, the report page, USD and video records, per-episode records, and a simulated
robot driving a bundle. The validate step and ``flows validate`` both evaluate and report
through here.

Imports :mod:`stages.datasets` and below.
"""
