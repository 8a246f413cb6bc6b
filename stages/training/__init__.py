"""Training algorithms: the algorithm registry, PPO (plain and pipelined, through rsl_rl),
DAgger, and policies trained elsewhere (``train: {source: ...}``).

Imports :mod:`stages.evaluation` and below.
"""
