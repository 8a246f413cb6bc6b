"""Simulation: scene and suite configs, the task registry, and batched simulator environments.

A task (robot model, observation, action, reward, success predicate and scripted expert) is
registered once in :mod:`stages.sim.tasks`; a scene (``sim_scenes/<task>/<scene>.yaml``) adds
randomization and an episode length; a suite lists scenes with episode counts and fixed seeds.
"""
