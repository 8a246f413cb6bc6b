"""Export a policy trained by LeRobot to ONNX, with LeRobot's own code (run in its environment).

Run by the ``lerobot`` stage environment's interpreter (``.venv-lerobot``, ``make lerobot``) as a
script, not imported by the project: it imports only the standard library, numpy, torch and
LeRobot. :mod:`stages.policies.lerobot` writes the request and reads what this leaves behind::

    .venv-lerobot/bin/python stages/policies/lerobot_export.py REQUEST.json

The request (JSON) names:

- ``source``: the policy's ``pretrained_model/`` folder (``config.json``, ``model.safetensors``,
  ``policy_preprocessor.json``, ``policy_postprocessor.json`` and their stats);
- ``inputs``: each LeRobot input feature and the graph input it becomes, in graph order
  (``{"observation.state": "obs", "observation.images.front": "front_image"}``);
- ``onnx``, ``reference``, ``report``: the files to write;
- ``probes``: an ``.npz`` of observations under the graph input names, each (T, B, ...): the
  state float32 (T, B, obs_dim), an image uint8 (T, B, H, W, 3);
- ``opset``: the ONNX opset; ``latency_iters``: queries timed at batch 1.

The graph is ``obs`` float32 (batch, obs_dim) and ``<camera>_image`` uint8 (batch, H, W, 3) ->
``actions`` float32 (batch, chunk_size, act_dim). Inside it, as LeRobot's environments feed a
policy: each image HWC uint8 -> CHW float32 in [0, 1]; then the policy's preprocessor pipeline
(normalization of state and images with its stats), the network, and the postprocessor pipeline
(unnormalization of the actions).

The reference (``.npz``) is what LeRobot itself answers on the probes: ``actions`` (T, B,
act_dim), one ``select_action`` per step through the preprocessor and postprocessor as
``lerobot-eval`` runs it (its action queue of ``n_action_steps``, or its temporal ensembler when
``temporal_ensemble_coeff`` is set), and ``chunks`` (B, chunk_size, act_dim), the
postprocessed ``predict_action_chunk`` at the first step. The report (JSON) holds the
versions, the policy's chunking settings and LeRobot's per-query latency on the CPU.

A diffusion policy takes its own way (stages/policies/lerobot_diffusion_export.py, loaded by
path): its graph reads a history of observations, a noise block and the scheduler's steps, and
its reference is ``select_action`` fed the same noise. A folder LeRobot cannot load, or a policy
type other than ``act`` or ``diffusion``, exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SUPPORTED = ("act", "diffusion")
"""LeRobot policy types exported: ACT (deterministic, one network call) and diffusion (its
denoising loop in the graph, its noise an input; lerobot_diffusion_export.py)."""


class Refusal(Exception):
    """The folder is not a policy this exports (one line for the user)."""


def load(source: Path) -> tuple[Any, Any, Any]:
    """The policy in ``source`` and its preprocessor and postprocessor, loaded by LeRobot.

    Returns (policy in eval mode on the CPU, preprocessor, postprocessor).
    """
    from lerobot.configs import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    try:
        config = PreTrainedConfig.from_pretrained(str(source), local_files_only=True)
    except Exception as exc:  # LeRobot raises draccus, OSError and ValueError alike
        raise Refusal(f"LeRobot cannot read its config.json: {first_line(exc)}") from None
    if config.type not in SUPPORTED:
        raise Refusal(f"a LeRobot {config.type!r} policy; exported here: {', '.join(SUPPORTED)}")
    config.device = "cpu"
    try:
        policy = get_policy_class(config.type).from_pretrained(
            str(source), config=config, local_files_only=True)
        pre, post = make_pre_post_processors(
            config, pretrained_path=str(source),
            preprocessor_overrides=on_cpu(source / "policy_preprocessor.json"),
            postprocessor_overrides=on_cpu(source / "policy_postprocessor.json"))
    except Exception as exc:  # a missing or corrupt weights or processor file
        raise Refusal(f"LeRobot cannot load the policy: {first_line(exc)}") from None
    policy.eval()
    return policy, pre, post


def on_cpu(pipeline: Path) -> dict[str, dict[str, str]]:
    """Overrides that put every step of the saved processor ``pipeline`` that has a device on
    the CPU (a policy trained on a GPU saves ``cuda``)."""
    steps = json.loads(pipeline.read_text()).get("steps", [])
    return {step["registry_name"]: {"device": "cpu"} for step in steps
            if "device" in step.get("config", {}) and "registry_name" in step}


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 200 characters (its type if empty)."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def lerobot_batch(inputs: dict[str, str], arrays: list[Any]) -> dict[str, Any]:
    """LeRobot's observation batch from the graph's tensors (torch), in ``inputs`` order: the
    state as given, each uint8 (B, H, W, 3) image as float32 (B, 3, H, W) in [0, 1]."""
    import torch

    batch: dict[str, Any] = {}
    for key, value in zip(inputs, arrays, strict=True):
        if value.dtype == torch.uint8:
            value = value.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        batch[key] = value
    return batch


def graph_module(policy: Any, pre: Any, post: Any, inputs: dict[str, str]) -> Any:
    """A torch module of the graph's tensors -> the postprocessed chunk (B, chunk, act_dim)."""
    import torch

    class Exported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, *arrays: torch.Tensor) -> torch.Tensor:
            batch = pre(lerobot_batch(inputs, list(arrays)))
            chunk: torch.Tensor = post(self.policy.predict_action_chunk(batch))
            return chunk

    return Exported().eval()


def export(module: Any, probes: dict[str, np.ndarray], inputs: dict[str, str], path: Path,
           opset: int) -> None:
    """Trace ``module`` on the first probe step and write the ONNX graph to ``path``."""
    import warnings

    import torch

    names = list(inputs.values())
    example = tuple(torch.from_numpy(np.ascontiguousarray(probes[n][0])) for n in names)
    axes = {n: {0: "batch"} for n in [*names, "actions"]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values it freezes
        torch.onnx.export(module, example, str(path), input_names=names,
                          output_names=["actions"], dynamic_axes=axes, opset_version=opset,
                          dynamo=False, do_constant_folding=True)
        chunk = module(*example).shape[1:]
    fixed_output(path, tuple(int(n) for n in chunk))


def fixed_output(path: Path, shape: tuple[int, ...]) -> None:
    """Declare the ONNX graph's ``actions`` output as (batch, *shape): the tracer leaves the
    chunk's length symbolic, though the network fixes it."""
    import onnx

    model = onnx.load(str(path))
    (output,) = model.graph.output
    for dim, size in zip(output.type.tensor_type.shape.dim[1:], shape, strict=True):
        dim.Clear()
        dim.dim_value = size
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def reference(policy: Any, pre: Any, post: Any, probes: dict[str, np.ndarray],
              inputs: dict[str, str]) -> dict[str, np.ndarray]:
    """LeRobot's answers on ``probes`` (module doc): ``actions`` (T, B, act_dim) from
    ``select_action`` step by step after one ``reset``, ``chunks`` (B, chunk, act_dim) from
    ``predict_action_chunk`` at the first step."""
    import torch

    names = list(inputs.values())
    steps = len(probes[names[0]])
    policy.reset()
    actions = []
    with torch.no_grad():
        for t in range(steps):
            arrays = [torch.from_numpy(np.ascontiguousarray(probes[n][t])) for n in names]
            batch = pre(lerobot_batch(inputs, arrays))
            if t == 0:
                chunks = post(policy.predict_action_chunk(batch)).numpy()
            actions.append(post(policy.select_action(batch)).numpy())
    policy.reset()
    return {"actions": np.stack(actions).astype(np.float32), "chunks": chunks.astype(np.float32)}


def latency_ms(policy: Any, pre: Any, post: Any, probes: dict[str, np.ndarray],
               inputs: dict[str, str], iters: int) -> list[float]:
    """Milliseconds of ``iters`` LeRobot queries at batch 1 (preprocessor, one chunk,
    postprocessor) on one CPU thread, as ONNX Runtime is timed, after two warm-up queries."""
    import torch

    torch.set_num_threads(1)
    arrays = [torch.from_numpy(np.ascontiguousarray(probes[n][0][:1])) for n in inputs.values()]
    times = []
    with torch.no_grad():
        for i in range(iters + 2):
            start = time.perf_counter()
            post(policy.predict_action_chunk(pre(lerobot_batch(inputs, arrays))))
            if i >= 2:
                times.append((time.perf_counter() - start) * 1e3)
    return times


def run(request: dict[str, Any]) -> None:
    """Carry out one export request (module doc)."""
    import lerobot
    import torch

    try:
        import onnx  # noqa: F401  (torch's ONNX exporter writes through it)
    except ImportError:
        raise Refusal("the lerobot environment has no onnx package, which torch's ONNX "
                      "exporter needs: rebuild it with make lerobot") from None
    torch.manual_seed(0)
    source = Path(request["source"])
    inputs: dict[str, str] = dict(request["inputs"])
    policy, pre, post = load(source)
    with np.load(request["probes"], allow_pickle=False) as data:
        probes = {name: data[name] for name in inputs.values()}
    if policy.config.type == "diffusion":
        diffusion_export().run_diffusion(request, policy, pre, post, probes, lerobot_batch)
        return
    export(graph_module(policy, pre, post, inputs), probes, inputs, Path(request["onnx"]),
           int(request["opset"]))
    answers: dict[str, Any] = reference(policy, pre, post, probes, inputs)
    np.savez(request["reference"], **answers)
    times = latency_ms(policy, pre, post, probes, inputs, int(request["latency_iters"]))
    config = policy.config
    report = {
        "lerobot": lerobot.__version__, "torch": torch.__version__, "type": config.type,
        "chunk_size": int(config.chunk_size), "n_action_steps": int(config.n_action_steps),
        "temporal_ensemble_coeff": config.temporal_ensemble_coeff,
        "latency_ms_p50": statistics.median(times) if times else None,
        "latency_ms_max": max(times) if times else None,
    }
    Path(request["report"]).write_text(json.dumps(report, indent=1))


def diffusion_export() -> Any:
    """The diffusion exporter, lerobot_diffusion_export.py beside this script, loaded by its
    path (the script runs with ``-I``: its folder is not on the path)."""
    import importlib.util

    path = Path(__file__).with_name("lerobot_diffusion_export.py")
    spec = importlib.util.spec_from_file_location("lerobot_diffusion_export", path)
    if spec is None or spec.loader is None:
        raise Refusal(f"{path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    """``lerobot_export.py REQUEST.json``; status 0, or 2 with one line for a refused folder."""
    if len(argv) != 1:
        print("usage: lerobot_export.py REQUEST.json", file=sys.stderr)
        return 2
    try:
        run(json.loads(Path(argv[0]).read_text()))
    except Refusal as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
