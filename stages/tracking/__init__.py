"""What MLflow keeps: the lineage recorder, the registry aliases (moved as a compare-and-set),
the policy as an MLflow model, TensorRT engine records, traces back to raw data, and the
migrated empty databases new ones start from.

Imports :mod:`stages.storage` and below.
"""
