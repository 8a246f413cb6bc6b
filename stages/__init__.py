"""The physai-flows domain: typed configs, artifacts, store, lineage and the five stages.

Nothing in this package imports Prefect; importing it touches no server, simulator or GPU.
"""
