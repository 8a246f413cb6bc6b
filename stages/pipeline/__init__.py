"""A pipeline as a whole: the config resolved and checked whole, running it, the nightly
regression, and the entry points of a stage environment (``envrun``) and of ``torchrun``
(``launch``).

The top layer of ``stages``: it may import every layer below; ``flows`` imports it.
"""
