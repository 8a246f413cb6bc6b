"""Datasets from elsewhere and back: the dataset-format registry (:mod:`stages.datasets.formats`),
the built-in formats (Isaac Lab / robomimic HDF5, LeRobot v3, Minari) and the import into the
artifact store (:mod:`stages.datasets.importer`)."""
