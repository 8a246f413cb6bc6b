"""Registry of edge targets: Jetson modules with the software stack their engines are built on.

A TensorRT engine is built on the target from the bundle's ONNX file, so what a target can
take is bounded by its TensorRT: the ONNX opsets its parser documents and the precisions its
GPU and TensorRT build support. Versions are those of the named JetPack release.
A plugin adds its own targets through the ``physai_flows.targets`` entry point group
(:mod:`physai_core.plugins`) by calling :func:`register_target`.
``max_onnx_opset`` is 20, the top of the range (opset 9-20) that onnx-tensorrt documents for
TensorRT 10.0 and that later TensorRT 10 releases keep parsing.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.errors import EdgeError, TargetError
from physai_core.plugins import Registry, unknown_message

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8", "fp4")
"""Every precision name a target may list, widest first."""

MIN_ONNX_OPSET = 9
"""Lowest ONNX opset the TensorRT 10 ONNX parser documents support for."""


@dataclass(frozen=True)
class EdgeTarget:
    """A robot computer and the JetPack software stack its TensorRT engines are built with."""

    name: str
    """Registry id, e.g. ``jetson-agx-thor``."""
    device: str
    """Module as NVIDIA names it."""
    jetpack: str
    """JetPack SDK release."""
    l4t: str
    """Jetson Linux (L4T) release of that JetPack."""
    cuda: str
    """CUDA toolkit release shipped with that JetPack."""
    tensorrt: str
    """TensorRT release shipped with that JetPack."""
    gpu_arch: str
    """GPU architecture as a compiler target, e.g. ``sm_87``."""
    max_onnx_opset: int
    """Highest ONNX opset this TensorRT's ONNX parser takes."""
    precisions: tuple[str, ...]
    """Engine precisions this GPU and TensorRT support, a subset of :data:`PRECISIONS`."""
    container_base: str
    """NVIDIA L4T JetPack container image of this JetPack, the base of the bundle's Dockerfile."""

    def __post_init__(self) -> None:
        """Reject an empty or unknown precision list and an opset below the parser's minimum."""
        unknown = [p for p in self.precisions if p not in PRECISIONS]
        if not self.precisions or unknown:
            raise EdgeError(
                f"edge target {self.name!r}: precisions must be a non-empty subset of "
                f"{list(PRECISIONS)} (value: {list(self.precisions)})"
            )
        if l4t_tag_problem(self.container_base, self.l4t):
            raise EdgeError(
                f"edge target {self.name!r}: container_base "
                f"{l4t_tag_problem(self.container_base, self.l4t)}"
            )
        if self.max_onnx_opset < MIN_ONNX_OPSET:
            raise EdgeError(
                f"edge target {self.name!r}: max_onnx_opset must be at least {MIN_ONNX_OPSET} "
                f"(value: {self.max_onnx_opset})"
            )


def l4t_tag_problem(image: str, l4t: str) -> str | None:
    """Why ``image`` is not an L4T JetPack image of the ``l4t`` release line, or None.

    L4T JetPack images are tagged ``r<major>.<minor>.<patch>`` by the L4T release; an image
    matches a target when its major and minor equal the target's.
    """
    repo, _, tag = image.rpartition(":")
    if not repo.endswith("/l4t-jetpack"):
        return f"must be an NVIDIA l4t-jetpack image (value: {image!r})"
    if tag.lstrip("r").split(".")[:2] != l4t.split(".")[:2] or not tag.startswith("r"):
        return f"tag must be r{'.'.join(l4t.split('.')[:2])}.x for L4T {l4t} (value: {image!r})"
    return None


TENSORRT10_MAX_ONNX_OPSET = 20
"""Highest ONNX opset the TensorRT 10 ONNX parser documents (opset 9-20, from TensorRT 10.0)."""

BUILTIN: tuple[EdgeTarget, ...] = tuple(
    EdgeTarget(name=name, device=device, jetpack=jetpack, l4t=l4t, cuda=cuda, tensorrt=tensorrt,
               gpu_arch=gpu_arch, max_onnx_opset=TENSORRT10_MAX_ONNX_OPSET, precisions=precisions,
               container_base=f"nvcr.io/nvidia/l4t-jetpack:{tag}")
    for name, device, jetpack, l4t, cuda, tensorrt, gpu_arch, precisions, tag in (
        # name, module, JetPack, L4T, CUDA, TensorRT, GPU architecture, precisions, image tag
        ("jetson-agx-thor", "NVIDIA Jetson AGX Thor (T5000)", "7.0", "38.2", "13.0", "10.13",
         "sm_110", ("fp32", "fp16", "bf16", "int8", "fp8", "fp4"), "r38.2.0"),
        ("jetson-agx-orin", "NVIDIA Jetson AGX Orin", "6.2", "36.4.3", "12.6", "10.3",
         "sm_87", ("fp32", "fp16", "int8"), "r36.4.0"),
    )
)
"""The targets this project ships: Jetson AGX Thor and Jetson AGX Orin."""


class _TargetRegistry(Registry[EdgeTarget]):
    """The edge targets' registry: its refusals are edge errors."""

    def unknown(self, name: str) -> Exception:
        """A :class:`TargetError` listing the valid names and the closest one."""
        return TargetError(unknown_message(self.kind, name, self._items))

    def duplicate(self, name: str) -> Exception:
        """An :class:`EdgeError` naming the target."""
        return EdgeError(f"{self.kind} {name!r} is already registered")


def _register_builtins() -> None:
    for target in BUILTIN:
        register_target(target)


TARGETS: Registry[EdgeTarget] = _TargetRegistry("edge target", _register_builtins)
"""Every edge target, plugins' included."""


def register_target(target: EdgeTarget) -> EdgeTarget:
    """Add ``target`` to the registry under its name; a second target with that name is refused."""
    return TARGETS.register(target)


def target_names() -> tuple[str, ...]:
    """Names of every registered target (plugins' included), sorted."""
    return TARGETS.names()


def get_target(name: str) -> EdgeTarget:
    """The target registered as ``name``; an unknown name lists the valid ones (plugins'
    included) and the closest."""
    return TARGETS.get(name)


def preflight(target: EdgeTarget, opset: int, precision: str) -> None:
    """Refuse, before any export, an ONNX opset or precision the target's TensorRT cannot take."""
    if not MIN_ONNX_OPSET <= opset <= target.max_onnx_opset:
        raise TargetError(
            f"edge target {target.name!r} (TensorRT {target.tensorrt}) parses ONNX opsets "
            f"{MIN_ONNX_OPSET}-{target.max_onnx_opset} (value: {opset})"
        )
    if precision not in PRECISIONS:
        raise TargetError(unknown_message("precision", precision, PRECISIONS))
    if precision not in target.precisions:
        raise TargetError(
            f"edge target {target.name!r} ({target.gpu_arch}, TensorRT {target.tensorrt}) "
            f"supports precisions {', '.join(target.precisions)} (value: {precision!r})"
        )
