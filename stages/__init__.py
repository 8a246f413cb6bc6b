"""The physai-flows domain: typed configs, artifacts, store, lineage and the five stages.

Its concept folders are layers, each importing only the ones below it (import-linter's
``stages-layers`` contract in pyproject.toml; docs/architecture.md draws them), bottom-up:

- ``core``: config schema, digests, limits, settings, file references, action units, crash
  points, the stage-environment registry (and :mod:`physai_core` below everything);
- ``artifacts``: the typed records every stage produces;
- ``storage``: the content-addressed artifact store;
- ``tracking``: MLflow: lineage, registry aliases, the model flavor, engine records, traces;
- ``sections``: the config of each pipeline stage;
- ``orchestration``: the stage table, the context a stage receives, stage environments' calls;
- ``sim``: scenes, the batched environment, tasks, simulator backends;
- ``policies``: local, vision, remote, LeRobot and ONNX policies;
- ``datasets``: demonstrations, dataset formats, import and export;
- ``evaluation``: statistics, gates, sensitivity, comparison, critic, reports;
- ``training``: the algorithm registry, PPO, DAgger, imported policies;
- ``steps``: collect, train, validate, package, promote;
- ``pipeline``: the config resolved whole, a run, the nightly, stage-environment entry points.

The modules directly in this folder (``algorithms``, ``environments``, ``envrun``, ``launch``,
``mlflow_model``, ``train``, ``units``) are aliases of paths that plugins, stored records or
commands name; nothing in the project imports them.

Nothing in this package imports Prefect; importing it touches no server, simulator or GPU.
"""
