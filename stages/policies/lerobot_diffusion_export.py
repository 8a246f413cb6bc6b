"""Export a LeRobot diffusion policy to one ONNX graph whose denoising loop the runtime drives.

Loaded by stages/policies/lerobot_export.py in the ``lerobot`` stage environment (with LeRobot's
``diffusion`` extra, which brings ``diffusers``'s schedulers); it imports only the standard
library, numpy, torch, onnx, diffusers and LeRobot, inside its functions.

The graph (opset of the request) reads, with ``n`` the policy's ``n_obs_steps``, ``S`` the
denoising steps and ``h`` its ``horizon``:

- ``obs`` float32 (batch, n, obs_dim) and ``<camera>_image`` uint8 (batch, n, H, W, 3): the
  last n observations, oldest first;
- ``noise`` float32 (batch, S + 1, h, act_dim): the initial sample, then the noise each step
  adds (a DDPM step with t > 0; DDIM adds none);
- ``schedule`` float32 (S, 8): one row a step, ``[t, p, q, c_x0, c_s, c_o, sigma, r]``;

and writes ``actions`` float32 (batch, n_action_steps, act_dim): LeRobot's
``actions[:, n - 1 : n - 1 + n_action_steps]``, unnormalized. Inside: the preprocessor and the
observation encoder once (``global_cond``), then an ONNX ``Loop`` over the schedule's rows, each
the U-Net and one scheduler step written as ``x0 = clip(p * s + q * o, -r, r)`` and
``s' = c_x0 * x0 + c_s * s + c_o * o + sigma * z`` (``s`` the sample, ``o`` the U-Net's output,
``z`` the step's noise), then the slice and the postprocessor. The rows are the scheduler's
arithmetic, computed by the runtime from the scheduler's parameters
(:func:`edge.runtime.diffusion_schedule`), so the number of steps is the runtime's to choose.

Those parameters, with the history, horizon and the noise generator, are the graph's metadata
``physai.diffusion`` (JSON), which a bundle's manifest copies into ``io.diffusion``.

The reference is LeRobot's own ``select_action`` fed the same noise: the initial sample through
its ``noise`` argument, each DDPM step's through ``diffusers``' ``randn_tensor``, both drawn from
the generator the metadata names, one block (batch, S + 1, h, act_dim) a query, as the runtime
draws them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

METADATA_KEY = "physai.diffusion"
"""The graph's metadata entry that describes its sampling (module doc)."""
GENERATOR = "numpy.random.PCG64"
"""The noise generator named in the metadata: ``numpy.random.Generator(PCG64(seed))``, each
block drawn by ``standard_normal(shape, dtype=float32)``."""
NOISE_SEED = 0
SCHEDULE_COLUMNS = 8


def scheduler_spec(policy: Any) -> dict[str, Any]:
    """What the runtime needs of the policy's scheduler to compute its steps: its type, the
    training's ``alphas_cumprod`` (float32, as the scheduler holds them), timestep spacing and
    offset, prediction type, clipping, DDPM's variance type and DDIM's final alpha."""
    sched = policy.diffusion.noise_scheduler
    config = sched.config
    kind = "DDIM" if type(sched).__name__ == "DDIMScheduler" else "DDPM"
    spec: dict[str, Any] = {
        "type": kind,
        "num_train_timesteps": int(config.num_train_timesteps),
        "alphas_cumprod": [float(a) for a in sched.alphas_cumprod.numpy().astype(np.float32)],
        "timestep_spacing": str(config.timestep_spacing),
        "steps_offset": int(config.steps_offset),
        "prediction_type": str(config.prediction_type),
        "clip_sample": bool(config.clip_sample),
        "clip_sample_range": float(config.clip_sample_range),
        "thresholding": bool(config.thresholding),
    }
    if kind == "DDPM":
        spec["variance_type"] = str(config.variance_type)
    else:
        spec["final_alpha_cumprod"] = float(sched.final_alpha_cumprod)
    return spec


def metadata(policy: Any) -> dict[str, Any]:
    """The graph's ``physai.diffusion`` metadata (module doc)."""
    config = policy.config
    return {"n_obs_steps": int(config.n_obs_steps), "horizon": int(config.horizon),
            "n_action_steps": int(config.n_action_steps),
            "steps": int(policy.diffusion.num_inference_steps),
            "noise": {"generator": GENERATOR, "seed": NOISE_SEED},
            "scheduler": scheduler_spec(policy)}


def parts(policy: Any, pre: Any, post: Any, inputs: dict[str, str],
          to_batch: Callable[[dict[str, str], list[Any]], dict[str, Any]]) -> tuple[Any, Any, Any]:
    """The three torch modules the graph is made of: the encoder (history -> ``global_cond``
    (batch, D)), the denoiser ((sample, timestep, global_cond) -> model output) and the
    decoder (final sample -> ``actions``)."""
    import torch

    config = policy.config
    model = policy.diffusion
    history = int(config.n_obs_steps)
    start = history - 1
    end = start + int(config.n_action_steps)
    cameras = list(config.image_features)
    state_key = "observation.state"

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *arrays: torch.Tensor) -> torch.Tensor:
            flat = [a.flatten(0, 1) for a in arrays]  # (batch * n, ...): one frame a row
            batch = pre(to_batch(inputs, flat))
            framed = {k: v.reshape(-1, history, *v.shape[1:]) for k, v in batch.items()
                      if k in inputs}
            seen = {state_key: framed[state_key]}
            if cameras:
                seen["observation.images"] = torch.stack([framed[k] for k in cameras], dim=-4)
            cond: torch.Tensor = self.model._prepare_global_conditioning(seen)
            return cond

    class Denoiser(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = model.unet

        def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                    global_cond: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.unet(sample, timestep, global_cond=global_cond)
            return out

    class Decoder(torch.nn.Module):
        def forward(self, sample: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = post(sample[:, start:end])
            return out

    return Encoder().eval(), Denoiser().eval(), Decoder().eval()


def fixed_crops(policy: Any) -> list[tuple[Any, Any]]:
    """Swap each image encoder's center crop for slicing at fixed offsets, torchvision's own
    (``round((side - crop) / 2)``) for the policy's image size: torchvision computes them from
    the image's shape, which tracing turns into tensors it cannot round. Returns (encoder,
    crop) pairs to put back."""
    import torch

    config = policy.config
    encoders = policy.diffusion.rgb_encoder
    encoders = list(encoders) if isinstance(encoders, torch.nn.ModuleList) else [encoders]
    shape = next(iter(config.image_features.values())).shape
    height, width = config.resize_shape or shape[1:]
    swapped = []
    for encoder in encoders:
        if not getattr(encoder, "do_crop", False):
            continue
        crop_h, crop_w = config.crop_shape
        if crop_h > height or crop_w > width:
            raise ValueError(f"crop {config.crop_shape} larger than the image {height}x{width}")
        top, left = round((height - crop_h) / 2.0), round((width - crop_w) / 2.0)

        class Crop(torch.nn.Module):
            def forward(self, x: torch.Tensor, top: int = top, left: int = left,
                        crop_h: int = crop_h, crop_w: int = crop_w) -> torch.Tensor:
                return x[..., top:top + crop_h, left:left + crop_w]

        swapped.append((encoder, encoder.center_crop))
        encoder.center_crop = Crop()
    return swapped


def _onnx(module: Any, example: tuple[Any, ...], names: list[str], output: str, path: Path,
          opset: int) -> Any:
    """``module`` traced on ``example`` as an ONNX model, every input's and the output's first
    axis the batch."""
    import warnings

    import onnx
    import torch

    axes = {n: {0: "batch"} for n in [*names, output]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values it freezes
        torch.onnx.export(module, example, str(path), input_names=names, output_names=[output],
                          dynamic_axes=axes, opset_version=opset, dynamo=False,
                          do_constant_folding=True)
    return onnx.load(str(path))


def export(policy: Any, pre: Any, post: Any, inputs: dict[str, str], probes: dict[str, Any],
           path: Path, opset: int,
           to_batch: Callable[[dict[str, str], list[Any]], dict[str, Any]]) -> None:
    """Write the graph of the module doc to ``path``: the three parts traced on the first probe
    step's history (its frame repeated), then joined around a ``Loop``."""
    import onnx
    import torch

    config = policy.config
    history, horizon = int(config.n_obs_steps), int(config.horizon)
    act_dim = int(config.action_feature.shape[0])
    encoder, denoiser, decoder = parts(policy, pre, post, inputs, to_batch)
    names = list(inputs.values())
    frames = [torch.from_numpy(np.ascontiguousarray(probes[n][0])) for n in names]
    example = tuple(f.unsqueeze(1).repeat(1, history, *[1] * (f.ndim - 1)) for f in frames)
    work = path.parent
    swapped = fixed_crops(policy)
    try:
        enc = _onnx(encoder, example, names, "global_cond", work / "encoder.onnx", opset)
    finally:
        for module, crop in swapped:
            module.center_crop = crop
    with torch.no_grad():
        cond = encoder(*example)
    batch = cond.shape[0]
    sample = torch.zeros(batch, horizon, act_dim)
    den = _onnx(denoiser, (sample, torch.zeros(batch, dtype=torch.long), cond),
                ["sample", "timestep", "global_cond"], "model_output", work / "denoiser.onnx",
                opset)
    dec = _onnx(decoder, (sample,), ["sample"], "actions", work / "decoder.onnx", opset)
    for part in ("encoder", "denoiser", "decoder"):
        (work / f"{part}.onnx").unlink()
    model = joined(enc, den, dec, history, horizon, act_dim, opset)
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(metadata(policy)))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _loop_body(den: Any, batch_dim: Any) -> Any:
    """The ``Loop``'s body: one row of ``schedule`` (outer scope, as ``noise``, the U-Net's
    weights and ``den/global_cond``), the U-Net on the carried sample, one scheduler step."""
    from onnx import TensorProto, helper

    node = helper.make_node
    nodes = [node("Gather", ["schedule", "i"], ["row"], axis=0)]
    terms = ["t", "p", "q", "c_x0", "c_s", "c_o", "sigma", "r"]
    nodes += [node("Gather", ["row", f"k/{k}"], [name], axis=0) for k, name in enumerate(terms)]
    nodes += [
        node("Cast", ["t"], ["t_long"], to=TensorProto.INT64),
        node("Shape", ["den/sample"], ["sample_shape"]),
        node("Slice", ["sample_shape", "k/0_1", "k/1_1"], ["batch_1"]),
        node("Expand", ["t_long", "batch_1"], ["den/timestep"]),
        *den.graph.node,
        node("Add", ["i", "k/1"], ["i_next"]),
        node("Gather", ["noise", "i_next"], ["z"], axis=1),
        node("Mul", ["p", "den/sample"], ["ps"]),
        node("Mul", ["q", "den/model_output"], ["qo"]),
        node("Add", ["ps", "qo"], ["x0"]),
        node("Neg", ["r"], ["neg_r"]),
        node("Clip", ["x0", "neg_r", "r"], ["x0_clipped"]),
        node("Mul", ["c_x0", "x0_clipped"], ["a"]),
        node("Mul", ["c_s", "den/sample"], ["b"]),
        node("Mul", ["c_o", "den/model_output"], ["c"]),
        node("Mul", ["sigma", "z"], ["d"]),
        node("Sum", ["a", "b", "c", "d"], ["sample_next"]),
        node("Identity", ["cond"], ["cond_next"]),
    ]
    sample_type = helper.make_tensor_type_proto(TensorProto.FLOAT, [batch_dim, None, None])
    return helper.make_graph(
        nodes, "denoising_step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_value_info("den/sample", sample_type)],
        [helper.make_tensor_value_info("cond_next", TensorProto.BOOL, []),
         helper.make_value_info("sample_next", sample_type)])


def joined(enc: Any, den: Any, dec: Any, history: int, horizon: int, act_dim: int,
           opset: int) -> Any:
    """The encoder, a ``Loop`` of the denoiser and scheduler step, and the decoder as one
    model (module doc). The parts' names are prefixed (``enc/``, ``den/``, ``dec/``) but for
    the graph's own inputs and ``actions``."""
    from onnx import TensorProto, compose, helper, numpy_helper

    enc = compose.add_prefix(enc, "enc/", rename_inputs=False)
    den = compose.add_prefix(den, "den/")
    dec = compose.add_prefix(dec, "dec/", rename_outputs=False)
    consts: dict[str, np.ndarray] = {
        "k/0_1": np.array([0], np.int64), "k/1_1": np.array([1], np.int64),
        **{f"k/{k}": np.array(k, np.int64) for k in range(SCHEDULE_COLUMNS)}}
    node = helper.make_node
    nodes = [
        *enc.graph.node,
        node("Identity", ["enc/global_cond"], ["den/global_cond"]),
        node("Gather", ["noise", "k/0"], ["sample0"], axis=1),
        node("Shape", ["schedule"], ["schedule_shape"]),
        node("Gather", ["schedule_shape", "k/0"], ["steps"], axis=0),
        node("Loop", ["steps", "", "sample0"], ["dec/sample"],
             body=_loop_body(den, "batch")),
        *dec.graph.node,
    ]
    inputs = [*enc.graph.input,
              helper.make_tensor_value_info("noise", TensorProto.FLOAT,
                                            ["batch", "steps_1", horizon, act_dim]),
              helper.make_tensor_value_info("schedule", TensorProto.FLOAT,
                                            ["steps", SCHEDULE_COLUMNS])]
    (out,) = dec.graph.output
    actions = helper.make_tensor_value_info(
        "actions", TensorProto.FLOAT,
        ["batch", *[d.dim_value for d in out.type.tensor_type.shape.dim[1:]]])
    initializers = [*enc.graph.initializer, *den.graph.initializer, *dec.graph.initializer,
                    *(numpy_helper.from_array(v, k) for k, v in consts.items())]
    graph = helper.make_graph(nodes, "lerobot_diffusion", inputs, [actions], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="physai-flows lerobot_diffusion_export")
    model.ir_version = enc.ir_version
    fixed_actions(model, horizon, history)
    return model


def fixed_actions(model: Any, horizon: int, history: int) -> None:
    """Check that ``actions`` declares a fixed (batch, n_action_steps, act_dim): the tracer
    leaves sizes symbolic where the network fixes them."""
    (output,) = model.graph.output
    dims = output.type.tensor_type.shape.dim
    if len(dims) != 3 or not all(d.dim_value > 0 for d in dims[1:]):
        raise ValueError(f"the decoder's actions have shape {dims}, not fixed "
                         f"(batch, n_action_steps <= {horizon - history + 1}, act_dim)")


def noise_blocks(seed: int) -> Callable[[tuple[int, ...]], np.ndarray]:
    """Blocks of the metadata's generator (:data:`GENERATOR`), one call a query."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return lambda shape: rng.standard_normal(shape, dtype=np.float32)


def reference(policy: Any, pre: Any, post: Any, probes: dict[str, np.ndarray],
              inputs: dict[str, str],
              to_batch: Callable[[dict[str, str], list[Any]], dict[str, Any]]
              ) -> dict[str, np.ndarray]:
    """LeRobot's answers on ``probes``: ``actions`` (T, B, act_dim) from ``select_action`` step
    by step after one ``reset``, each query fed the next noise block (module doc); ``chunks``
    (B, n_action_steps, act_dim), the first query's actions, postprocessed."""
    import diffusers.schedulers.scheduling_ddpm as ddpm
    import torch

    config = policy.config
    steps = int(policy.diffusion.num_inference_steps)
    act_dim = int(config.action_feature.shape[0])
    names = list(inputs.values())
    draw = noise_blocks(NOISE_SEED)
    step_noise: list[torch.Tensor] = []
    chunks: list[torch.Tensor] = []
    original = policy.predict_action_chunk

    def given_noise(shape: Any, **_: Any) -> torch.Tensor:
        return step_noise.pop(0)

    def kept(batch: Any, noise: Any = None) -> Any:
        out = original(batch, noise=noise)
        chunks.append(out)
        return out

    policy.reset()
    actions = []
    patched, ddpm.randn_tensor = ddpm.randn_tensor, given_noise
    policy.predict_action_chunk = kept
    try:
        with torch.no_grad():
            for t in range(len(probes[names[0]])):
                arrays = [torch.from_numpy(np.ascontiguousarray(probes[n][t])) for n in names]
                noise = None
                if len(policy._queues["action"]) == 0:  # LeRobot queries this step
                    block = torch.from_numpy(draw((len(arrays[0]), steps + 1, int(config.horizon),
                                                   act_dim)))
                    noise = block[:, 0]
                    step_noise[:] = [block[:, i + 1] for i in range(steps)]
                actions.append(post(policy.select_action(pre(to_batch(inputs, arrays)),
                                                         noise=noise)).numpy())
    finally:
        ddpm.randn_tensor = patched
        del policy.predict_action_chunk
    policy.reset()
    first = post(chunks[0]).numpy()
    return {"actions": np.stack(actions).astype(np.float32), "chunks": first.astype(np.float32)}


def latency_ms(policy: Any, pre: Any, post: Any, probes: dict[str, np.ndarray],
               inputs: dict[str, str], iters: int,
               to_batch: Callable[[dict[str, str], list[Any]], dict[str, Any]]) -> list[float]:
    """Milliseconds of ``iters`` LeRobot queries at batch 1 (a reset, then ``select_action``:
    preprocessor, history, the whole denoising loop, postprocessor) on one CPU thread, after
    two warm-up queries."""
    import torch

    torch.set_num_threads(1)
    arrays = [torch.from_numpy(np.ascontiguousarray(probes[n][0][:1])) for n in inputs.values()]
    times = []
    with torch.no_grad():
        for i in range(iters + 2):
            policy.reset()
            start = time.perf_counter()
            post(policy.select_action(pre(to_batch(inputs, arrays))))
            if i >= 2:
                times.append((time.perf_counter() - start) * 1e3)
    policy.reset()
    return times


def run_diffusion(request: dict[str, Any], policy: Any, pre: Any, post: Any,
                  probes: dict[str, np.ndarray],
                  to_batch: Callable[[dict[str, str], list[Any]], dict[str, Any]]) -> None:
    """Carry out an export request (stages/policies/lerobot_export.py) for a diffusion policy:
    the graph, the reference under the same noise, LeRobot's latency and the report."""
    import lerobot
    import torch

    inputs: dict[str, str] = dict(request["inputs"])
    export(policy, pre, post, inputs, probes, Path(request["onnx"]), int(request["opset"]),
           to_batch)
    answers: dict[str, Any] = reference(policy, pre, post, probes, inputs, to_batch)
    np.savez(request["reference"], **answers)
    times = latency_ms(policy, pre, post, probes, inputs, int(request["latency_iters"]),
                       to_batch)
    config = policy.config
    report = {
        "lerobot": lerobot.__version__, "torch": torch.__version__, "type": config.type,
        "chunk_size": int(config.n_action_steps), "n_action_steps": int(config.n_action_steps),
        "temporal_ensemble_coeff": None, "diffusion": metadata(policy),
        "latency_ms_p50": statistics.median(times) if times else None,
        "latency_ms_max": max(times) if times else None,
    }
    Path(request["report"]).write_text(json.dumps(report, indent=1))
