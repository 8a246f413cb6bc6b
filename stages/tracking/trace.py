"""Follow a registered model version back to its raw data, verifying every digest on the way."""

from __future__ import annotations

from dataclasses import dataclass

from physai_core.errors import PhysaiError
from stages.artifacts.records import ArtifactBase
from stages.storage.store import ArtifactStore
from stages.tracking.lineage import LineageRecorder, ModelRef

OPTIONAL_ROLES = ("dataset", "teacher")
"""Links only some chains have: a PPO policy has no dataset, a scripted-expert dataset no
teacher."""


@dataclass(frozen=True)
class Link:
    """One artifact in the chain and whether its payload verified against its digest."""

    role: str
    artifact: ArtifactBase | None
    digest: str
    verified: bool
    error: str = ""


@dataclass(frozen=True)
class Chain:
    """Model version -> bundle, sim report, policy (training run) -> dataset (collection run)
    -> teacher policy (its training run), as far as the chain goes."""

    model: ModelRef
    links: tuple[Link, ...]

    @property
    def verified(self) -> bool:
        """True when every link's payload matched its digest."""
        return all(link.verified for link in self.links)

    def has(self, role: str) -> bool:
        """True when the chain has a link playing ``role``."""
        return any(link.role == role for link in self.links)

    def link(self, role: str) -> Link:
        """The link playing ``role``."""
        for link in self.links:
            if link.role == role:
                return link
        raise KeyError(role)


def _resolve(role: str, digest: str, store: ArtifactStore) -> Link:
    try:
        artifact = store.get(digest)
        store.open_payload(artifact)
    except PhysaiError as exc:
        return Link(role, None, digest, False, str(exc))
    return Link(role, artifact, digest, True)


def trace_model(uri: str, store: ArtifactStore, lineage: LineageRecorder) -> Chain:
    """The lineage chain of ``models:/NAME@ALIAS`` (or ``/VERSION``), every digest verified."""
    model = lineage.resolve_model(uri)
    links = []
    for role in ("bundle", "sim_report", "policy", "dataset", "teacher"):
        digest = model.tags.get(f"physai.{role}.digest")
        if digest is None and role in OPTIONAL_ROLES:
            continue
        if digest is None:
            raise PhysaiError(f"{uri}: model version {model.version} has no physai.{role}.digest"
                              " tag; it was not registered by physai-flows")
        links.append(_resolve(role, digest, store))
    return Chain(model, tuple(links))
