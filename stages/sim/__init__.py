"""Simulation, in five layers, each importing only the ones below it (and the layers below
``stages.sim``):

- ``scenes``: scene data (a scene's config, its randomization, the loaded scene), no registry;
- ``env``: the batched environment every backend implements and what they share (observations,
  cameras, bodies, fixed-length episodes, MuJoCo's worlds, tiled cameras, overlapped rollouts);
- ``tasks``: the task registry (:mod:`stages.sim.tasks.catalog`) and the tasks written once
  (reach, reach-vision, locomotion, task templates);
- ``backends``: the simulator-backend registry and the adapters (Gymnasium, Isaac Lab);
- ``suites``: scene and suite files loaded and checked against the task and backend
  registries, suites resolved, and their digests.

A task (robot model, observation, action, reward, success predicate and scripted expert) is
registered once; a scene (``sim_scenes/<task>/<scene>.yaml``) adds randomization and an episode
length; a suite lists scenes with episode counts and fixed seeds. The modules directly in this
folder (``batched``, ``scene``, ``mujoco_env``, ``reach_arm``, ``locomotion``) and the packages
``tasks`` and ``backends`` themselves are the paths docs/extending.md promises plugins.
"""
