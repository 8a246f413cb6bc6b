"""Simulation: scene and suite configs, the task registry, and batched simulator environments.

A task (robot model, observation, action, reward, success predicate and scripted expert) is
registered once in :mod:`stages.sim.tasks`; a scene (``sim_scenes/<task>/<scene>.yaml``) adds
randomization and an episode length; a suite lists scenes with episode counts and fixed seeds.
MuJoCo tasks (:mod:`stages.sim.reach`, :mod:`stages.sim.locomotion`) build on
:mod:`stages.sim.mujoco_env`, which steps every world of an environment in C across threads.
"""
