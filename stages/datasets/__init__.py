"""Datasets from elsewhere and back: demonstrations in the store's HDF5 layout and the budget
every reader charges (:mod:`stages.datasets.demonstrations`), recording them with an expert
(:mod:`stages.datasets.recording`), the dataset-format registry
(:mod:`stages.datasets.formats`), the built-in formats (Isaac Lab / robomimic HDF5, LeRobot v3,
Minari) and the import into the artifact store (:mod:`stages.datasets.importer`).

Imports :mod:`stages.policies` and below.
"""
