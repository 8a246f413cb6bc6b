"""Moving a registry alias as a compare-and-set, with its history and rollback.

MLflow sets an alias unconditionally, so two promotions racing would both "win" and the last
writer would silently replace a champion it never compared against. Here an alias moves only
inside a registry lock and only if it still points where the caller saw it
(:func:`compare_and_set_alias`); a caller that lost the race gets :class:`AliasConflict`.

The lock is a registered model ``physai-lock.<model>`` in the same MLflow registry: creating
a registered model that exists fails atomically in MLflow's database, so exactly one caller
holds it. It is deleted on release; one left by a crashed holder is broken at once when the
holder was a process of this host that no longer exists, else after :data:`LOCK_TTL_S`
seconds.

History: every alias change adds an event to the registered model's tag
``physai.<alias>.history`` (JSON list, oldest first) and tags on the versions involved:
a promotion sets ``physai.<alias>.promoted_at``, ``..._by``, ``..._why`` and
``physai.<alias>.previous`` on the new version; a rollback sets
``physai.<alias>.restored_at``, ``..._by``, ``..._why`` on the restored one and
``physai.<alias>.rolled_back_at`` on the version it replaced. :func:`rollback_alias` moves the
alias back to the current version's ``physai.<alias>.previous``.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from stages.crash import crash_point
from stages.errors import PhysaiError
from stages.lineage import LineageRecorder

log = logging.getLogger(__name__)

LOCK_PREFIX = "physai-lock."
LOCK_TTL_S = 300.0
"""A lock older than this is taken to belong to a crashed holder and is broken."""
HISTORY_KEEP = 100
"""Events kept in the registered model's history tag (MLflow tag values are bounded)."""


class AliasConflict(PhysaiError):
    """The alias no longer points where the caller saw it: someone else moved it first."""

    exit_code = 3


class RollbackError(PhysaiError):
    """Nothing to roll back to."""

    exit_code = 2


@dataclass(frozen=True)
class AliasEvent:
    """One alias change, as recorded in the history."""

    event: str
    """``promote`` or ``rollback``."""
    alias: str
    version: str
    previous: str | None
    by: str
    at: str
    why: str


def actor() -> str:
    """Who is acting: ``PHYSAI_ACTOR`` or ``user@host``, with the Prefect flow run when in one."""
    who = os.environ.get("PHYSAI_ACTOR")
    if not who:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # a container user without a passwd entry
            user = str(os.getuid())
        who = f"{user}@{socket.gethostname()}"
    run = os.environ.get("PREFECT__FLOW_RUN_ID")
    return f"{who} (flow run {run})" if run else who


@contextmanager
def registry_lock(lineage: LineageRecorder, model: str, timeout_s: float = 60.0) -> Iterator[None]:
    """Hold the registry lock of ``model`` for the block; wait up to ``timeout_s`` for it."""
    from mlflow.exceptions import MlflowException

    name = f"{LOCK_PREFIX}{model}"
    token = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            lineage.call("create_registered_model", name,
                         tags={"physai.lock.token": token, "physai.lock.holder": actor(),
                               "physai.lock.host": socket.gethostname(),
                               "physai.lock.pid": str(os.getpid()),
                               "physai.lock.expires": f"{time.time() + LOCK_TTL_S:.3f}"},
                         description=f"lock of {model}'s aliases; deleted when released")
            break
        except MlflowException as exc:
            # RESOURCE_DOES_NOT_EXIST: the server created the lock while the holder before us
            # deleted its own, and lost track of ours. Either way ask again: a lock we do hold
            # answers ALREADY_EXISTS with our token next time round.
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                raise
        held = _lock_tags(lineage, name)
        if held.get("physai.lock.token") == token:
            break  # our create went through but its reply was lost and retried
        if held and _stale(held):
            log.warning("breaking the stale registry lock %s of %s", name,
                        held.get("physai.lock.holder"))
            _delete(lineage, name)
            continue
        if time.monotonic() > deadline:
            raise PhysaiError(f"registry lock {name} held by {held.get('physai.lock.holder')} "
                              f"for more than {timeout_s:g} s")
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.5)
    try:
        yield
    finally:
        _delete(lineage, name)


def _stale(tags: dict[str, str]) -> bool:
    """A lock past its expiry, or taken by a process of this host that no longer exists."""
    if float(tags.get("physai.lock.expires", "inf")) < time.time():
        return True
    if tags.get("physai.lock.host") != socket.gethostname():
        return False
    try:
        os.kill(int(tags.get("physai.lock.pid", "0")), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def _lock_tags(lineage: LineageRecorder, name: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return dict(lineage.client.get_registered_model(name).tags)
    except MlflowException:
        return {}


def _delete(lineage: LineageRecorder, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        lineage.call("delete_registered_model", name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def current_version(lineage: LineageRecorder, model: str, alias: str) -> str | None:
    """The version ``model@alias`` points at, or None."""
    ref = lineage.find_alias(model, alias)
    return ref.version if ref is not None else None


def history(lineage: LineageRecorder, model: str, alias: str) -> list[AliasEvent]:
    """The recorded alias changes of ``model@alias``, oldest first."""
    tags = lineage.call("get_registered_model", model).tags
    raw = json.loads(tags.get(f"physai.{alias}.history", "[]"))
    return [AliasEvent(**event) for event in raw]


def compare_and_set_alias(
    lineage: LineageRecorder,
    model: str,
    alias: str,
    expected: str | None,
    version: str,
    *,
    why: str,
    event: str = "promote",
    lock_timeout_s: float = 60.0,
) -> AliasEvent:
    """Point ``model@alias`` at ``version`` if it still points at ``expected`` (None: unset).

    Raises :class:`AliasConflict`, moving nothing, when it points elsewhere.
    """
    with registry_lock(lineage, model, lock_timeout_s):
        crash_point("alias.lock_held")
        current = current_version(lineage, model, alias)
        if current != expected:
            raise AliasConflict(
                f"{model}@{alias} is {_v(current)}, not {_v(expected)} as this {event} saw it; "
                f"{_v(version)} was not made @{alias}"
            )
        now = datetime.now(UTC).isoformat(timespec="seconds")
        change = AliasEvent(event=event, alias=alias, version=version, previous=current,
                            by=actor(), at=now, why=why)
        lineage.set_alias(model, alias, version)
        crash_point("alias.moved")
        prefix = f"physai.{alias}"
        if event == "promote":
            lineage.set_version_tags(model, version, {
                f"{prefix}.promoted_at": now, f"{prefix}.promoted_by": change.by,
                f"{prefix}.promoted_why": why[:4000], f"{prefix}.previous": current or "",
            })
        else:
            lineage.set_version_tags(model, version, {
                f"{prefix}.restored_at": now, f"{prefix}.restored_by": change.by,
                f"{prefix}.restored_why": why[:4000],
            })
            if current is not None:
                lineage.set_version_tags(model, current, {f"{prefix}.rolled_back_at": now})
        events = [asdict(e) for e in history(lineage, model, alias)] + [asdict(change)]
        crash_point("alias.tags_written")
        lineage.call("set_registered_model_tag", model, f"{prefix}.history",
                     json.dumps(events[-HISTORY_KEEP:], separators=(",", ":")))
    return change


def rollback_alias(lineage: LineageRecorder, model: str, alias: str, why: str) -> AliasEvent:
    """Move ``model@alias`` back to the version it pointed at before the current one."""
    current = lineage.find_alias(model, alias)
    if current is None:
        raise RollbackError(f"models:/{model}@{alias} is not set; nothing to roll back")
    previous = current.tags.get(f"physai.{alias}.previous", "")
    if not previous:
        raise RollbackError(f"models:/{model}@{alias} is v{current.version}, which has no "
                            f"previous @{alias} to roll back to")
    return compare_and_set_alias(lineage, model, alias, current.version, previous,
                                 why=why, event="rollback")


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "unset"
