"""The foundations every package of physai-flows stands on: the one error hierarchy
(:mod:`physai_core.errors`) and the plugin registry (:mod:`physai_core.plugins`).

It imports nothing of ``stages``, ``flows`` or ``edge``, and nothing heavier than the standard
library: edge imports it on the packaging side, and ``stages`` and ``flows`` through every layer.
"""
