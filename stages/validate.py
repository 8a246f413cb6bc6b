"""The validate stage: roll the policy out over a frozen scene suite and apply the gates."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from stages.artifacts import GateResult, Policy, SceneResult, SimReport
from stages.config import ValidateConfig
from stages.context import StageContext
from stages.policy import load_policy, policy_fn
from stages.sim.batched import BatchedEnv
from stages.sim.tasks import get_task
from stages.stats import wilson_interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
PolicyFn = Callable[[np.ndarray], np.ndarray]


def rollout(env: BatchedEnv, act: PolicyFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run one episode in every world, the policy called once per step for all worlds.

    Returns (success (N,) bool, episode return (N,), final reward (N,)).
    """
    obs = env.reset()
    returns = np.zeros(env.num_worlds, np.float64)
    reward = np.zeros(env.num_worlds, np.float32)
    for _ in range(env.episode_steps):
        obs, reward, _ = env.step(act(obs))
        returns += reward
    return env.success(), returns, reward


def evaluate_scene(
    env: BatchedEnv, act: PolicyFn, scene: str, episodes: int
) -> SceneResult:
    """Success rate with a 95% Wilson interval, mean return and final distance for one scene."""
    success, returns, final_reward = rollout(env, act)
    k = int(success.sum())
    low, high = wilson_interval(k, episodes)
    return SceneResult(
        scene=scene,
        episodes=episodes,
        successes=k,
        success_rate=k / episodes,
        ci_low=low,
        ci_high=high,
        mean_return=float(returns.mean()),
        mean_final_distance=float(-final_reward.mean()),
    )


def gate_scenes(cfg: ValidateConfig, scenes: tuple[SceneResult, ...]) -> tuple[GateResult, ...]:
    """One gate per scene: the interval's lower bound must reach the scene's threshold."""
    gates = []
    for s in scenes:
        threshold = cfg.scene_min_success.get(s.scene, cfg.min_success)
        gates.append(
            GateResult(
                name=f"success/{s.scene}",
                measured=s.ci_low,
                threshold=threshold,
                passed=s.ci_low >= threshold,
                detail=f"{s.successes}/{s.episodes} = {s.success_rate:.3f} "
                f"[{s.ci_low:.3f}, {s.ci_high:.3f}]",
            )
        )
    return tuple(gates)


def validate_scene(policy: Policy, index: int, ctx: StageContext) -> SceneResult:
    """Evaluate ``policy`` on scene ``index`` of the suite, with its episode count and seed.

    Scenes are independent, so the flow fans them out in parallel and caches each on its own.
    """
    scene, episodes, seed = ctx.pipeline.suite.scenes[index]
    module, _ = load_policy(ctx.store.open_payload(policy))
    env = get_task(policy.task).make_env(scene, episodes, seed)
    with ctx.progress.bar(f"validate {scene.config.name}", episodes) as bar:
        result = evaluate_scene(env, policy_fn(module), scene.config.name, episodes)
        bar.advance(episodes, success=f"{result.success_rate:.2f}")
    return result


def assemble_report(
    cfg: ValidateConfig, policy: Policy, scenes: tuple[SceneResult, ...], ctx: StageContext
) -> SimReport:
    """Gate the per-scene results, log them with a plot to MLflow and publish the report."""
    import mujoco

    suite = ctx.pipeline.suite
    gates = gate_scenes(cfg, scenes)
    passed = all(g.passed for g in gates)
    with ctx.lineage.stage_run(ctx.experiment, "validate", ctx.pipeline_run_id, {}) as run:
        run.log_params({"suite": suite.config.name, "suite_digest": suite.digest,
                        "min_success": cfg.min_success, "backend": "mujoco",
                        "backend_version": mujoco.__version__})
        for r in scenes:
            run.log_metrics({f"{r.scene}/success_rate": r.success_rate,
                             f"{r.scene}/ci_low": r.ci_low, f"{r.scene}/ci_high": r.ci_high,
                             f"{r.scene}/mean_return": r.mean_return})
        body = {
            "suite": suite.config.name,
            "suite_digest": suite.digest,
            "backend": "mujoco",
            "backend_version": mujoco.__version__,
            "policy_digest": policy.digest,
            "scenes": [r.model_dump() for r in scenes],
            "gates": [g.model_dump() for g in gates],
            "passed": passed,
        }
        run.log_dict(body, "sim_report.json")
        run.log_figure(success_plot(scenes, gates), "success_rates.png")
        path = ctx.scratch / f"report-{run.run_id}.json"
        path.write_text(json.dumps(body, indent=2, sort_keys=True))
        report = ctx.store.publish(
            path,
            lambda digest, uri: SimReport(
                digest=digest,
                uri=uri,
                producer=ctx.producer("validate", STAGE_VERSION),
                parents=(policy.digest,),
                mlflow_run_id=run.run_id,
                suite=suite.config.name,
                suite_digest=suite.digest,
                backend="mujoco",
                backend_version=mujoco.__version__,
                scenes=scenes,
                gates=gates,
                passed=passed,
            ),
        )
        path.unlink()
        run.set_tags({"physai.sim_report.digest": report.digest, "physai.gates_passed": passed})
    log.info("validation %s on suite %s", "passed" if passed else "FAILED", suite.config.name)
    return report


def validate(cfg: ValidateConfig, policy: Policy, ctx: StageContext) -> SimReport:
    """Evaluate ``policy`` on every scene of the suite, one after the other, and report."""
    scenes = tuple(validate_scene(policy, i, ctx) for i in range(len(ctx.pipeline.suite.scenes)))
    return assemble_report(cfg, policy, scenes, ctx)


def success_plot(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...]) -> Figure:
    """Bar chart of success rate per scene with 95% intervals and the gate thresholds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 * len(scenes) + 2, 3.8), dpi=100)
    ax = fig.add_subplot()
    x = np.arange(len(scenes))
    rates = np.array([s.success_rate for s in scenes])
    err = np.clip([[s.success_rate - s.ci_low for s in scenes],
                   [s.ci_high - s.success_rate for s in scenes]], 0.0, None)
    colors = ["tab:green" if g.passed else "tab:red" for g in gates]
    ax.bar(x, rates, yerr=err, capsize=6, color=colors, alpha=0.8)
    for i, g in enumerate(gates):
        ax.hlines(g.threshold, i - 0.4, i + 0.4, colors="k", linestyles="dashed")
    ax.set_xticks(x, [s.scene for s in scenes], rotation=15)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title("validation per scene (dashed: gate on lower bound)")
    fig.tight_layout()
    return fig
