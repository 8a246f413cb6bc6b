"""Scene data: what a scene is (a task id, randomization, an episode length, a success
predicate, sweeps), read from YAML by the layers above.

The bottom of ``stages.sim``: imports the layers below ``stages.sim`` only. It names tasks by
their registered ids and looks up no registry: the task registry's lookup is passed in by whoever
loads scene files (:func:`stages.sim.scenes.scene.tasks_from`, :mod:`stages.sim.suites`).
"""
