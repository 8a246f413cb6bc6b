"""Judging a policy: success statistics, sequential gates, sensitivity, challenger against
champion, the Cosmos critic, the report page, USD and video records, per-episode records, and
a simulated robot driving a bundle.

Imports :mod:`stages.datasets` and below.
"""
