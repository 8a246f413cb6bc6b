"""The content-addressed artifact store: a local folder or an S3 bucket, one interface.

Imports :mod:`stages.core` and :mod:`stages.artifacts`.
"""
