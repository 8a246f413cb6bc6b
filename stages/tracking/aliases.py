"""Moving a registry alias as a compare-and-set, with its history and rollback.

MLflow sets an alias unconditionally, so two promotions racing would both "win" and the last
writer would silently replace a champion it never compared against. Here an alias moves only
inside a registry lock and only if it still points where the caller saw it
(:func:`compare_and_set_alias`); a caller that lost the race gets :class:`AliasConflict`.

The lock lives in the same MLflow registry, as registered models named
``physai-lock.<model>.<token>``, one per process that wants the lock, each with its own random
token. A process creates its own, then lists the lock's registered models: alone, it holds the
lock; not alone, it deletes its own and tries again later (of two that overlap, the later one
always sees the earlier one). Every delete names one token, so releasing a lock, or breaking a
stale one, can only ever remove the registered model it meant to: never the lock of whoever
took over. The holder renews its lease (the ``physai.lock.expires`` tag) every third of
:data:`LOCK_TTL_S` while it holds the lock, and checks the lock is still its own just before
it moves an alias. A lock is stale, and broken, when its lease has run out, or at once when
its holder was a process of this host that no longer exists. A lock named
``physai-lock.<model>`` (as older versions took it) is waited for and broken the same way.

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
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from physai_core.errors import PhysaiError
from stages.core.crash import crash_point
from stages.tracking.lineage import LineageRecorder

if TYPE_CHECKING:
    from mlflow.entities.model_registry import RegisteredModel

log = logging.getLogger(__name__)

LOCK_PREFIX = "physai-lock."
LOCK_TTL_S = 300.0
"""A lease: a lock not renewed for this long is taken to belong to a crashed or stalled holder
and is broken. Its holder renews it every third of this."""
HISTORY_KEEP = 100
"""Events kept in the registered model's history tag (MLflow tag values are bounded)."""
_TOKEN, _HOLDER, _HOST, _PID, _EXPIRES = (
    f"physai.lock.{key}" for key in ("token", "holder", "host", "pid", "expires"))
_LOCK_TOKEN = re.compile(r"[0-9a-f]{32}")


class AliasConflict(PhysaiError):
    """The alias no longer points where the caller saw it: someone else moved it first."""

    exit_code = 3


class LockLost(AliasConflict):
    """The registry lock was broken while its holder still meant to write (it stalled past
    its lease): nothing was moved."""


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


class RegistryLock:
    """The registry lock of one model, as one process takes, renews and releases it.

    Use it through :func:`registry_lock`.
    """

    def __init__(self, lineage: LineageRecorder, model: str, ttl_s: float) -> None:
        self.lineage = lineage
        self.model = model
        self.ttl_s = ttl_s
        self.token = uuid.uuid4().hex
        self.name = f"{LOCK_PREFIX}{model}.{self.token}"
        """This process's registered model: it holds the lock while it is the only one."""
        self._lease_end = 0.0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, timeout_s: float) -> None:
        """Take the lock, breaking stale ones; wait up to ``timeout_s`` for a live holder."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            _, others = self._survey()
            if not others:
                self._create()
                mine, others = self._survey()
                if mine and not others:
                    break
                self._delete()  # someone else came at the same moment: both step back
            if time.monotonic() > deadline:
                holder = others[0].get(_HOLDER) if others else None
                raise PhysaiError(f"registry lock {LOCK_PREFIX}{self.model} held by {holder} "
                                  f"for more than {timeout_s:g} s")
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)
        self._renewer = threading.Thread(target=self._renew, daemon=True,
                                         name=f"renew {self.name}")
        self._renewer.start()

    def check(self) -> None:
        """Raise :class:`LockLost` unless this process still holds the lock: its lease has not
        run out and nobody broke it."""
        if time.monotonic() >= self._lease_end or not self._exists():
            raise LockLost(f"the registry lock of {self.model} was broken while this process "
                           f"held it (its lease of {self.ttl_s:g} s ran out); nothing moved")

    def release(self) -> None:
        """Stop renewing and delete this process's registered model (never another's)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if not self._delete():
            log.warning("the registry lock of %s was broken while this process held it",
                        self.model)

    def _tags(self) -> dict[str, str]:
        return {_TOKEN: self.token, _HOLDER: actor(), _HOST: socket.gethostname(),
                _PID: str(os.getpid()), _EXPIRES: f"{time.time() + self.ttl_s:.3f}"}

    def _create(self) -> None:
        from mlflow.exceptions import MlflowException

        started = time.monotonic()
        try:
            self.lineage.call("create_registered_model", self.name, tags=self._tags(),
                              description=f"lock of {self.model}'s aliases; deleted when "
                                          "released")
        except MlflowException as exc:
            # ALREADY_EXISTS: a retried create whose first reply was lost (the name is ours
            # alone). DOES_NOT_EXIST: the server lost track of it; the survey that follows
            # finds out whether it exists.
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                raise
        self._lease_end = started + self.ttl_s

    def _exists(self) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.lineage.call("get_registered_model", self.name)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def _delete(self) -> bool:
        """Delete this process's registered model; False when it was gone already."""
        return _delete(self.lineage, self.name)

    def _survey(self) -> tuple[bool, list[dict[str, str]]]:
        """Whether this process's registered model exists, and the tags of every other lock of
        this model that is not stale, oldest first; stale ones are broken on the way."""
        mine = False
        live = []
        for other in _lock_models(self.lineage, self.model):
            if other.name == self.name:
                mine = True
                continue
            tags = dict(other.tags)
            if _stale(tags):
                log.warning("breaking the stale registry lock %s of %s", other.name,
                            tags.get(_HOLDER))
                _delete(self.lineage, other.name)
            else:
                live.append(tags)
        return mine, live

    def _renew(self) -> None:
        from mlflow.exceptions import MlflowException

        while not self._stop.wait(self.ttl_s / 3):
            started = time.monotonic()
            try:
                self.lineage.call("set_registered_model_tag", self.name, _EXPIRES,
                                  f"{time.time() + self.ttl_s:.3f}")
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    log.warning("the registry lock of %s was broken while this process held "
                                "it", self.model)
                    return
                log.warning("renewing the registry lock of %s failed: %s", self.model, exc)
            except PhysaiError as exc:
                log.warning("renewing the registry lock of %s failed: %s", self.model, exc)
            else:
                self._lease_end = started + self.ttl_s


@contextmanager
def registry_lock(
    lineage: LineageRecorder, model: str, timeout_s: float = 60.0
) -> Iterator[RegistryLock]:
    """Hold the registry lock of ``model`` for the block, renewing it meanwhile; wait up to
    ``timeout_s`` for it. Call the lock's :meth:`~RegistryLock.check` before each write the
    lock guards."""
    lock = RegistryLock(lineage, model, LOCK_TTL_S)
    lock.acquire(timeout_s)
    try:
        yield lock
    finally:
        lock.release()


def _stale(tags: dict[str, str]) -> bool:
    """A lock past its expiry, or taken by a process of this host that no longer exists."""
    try:
        expires = float(tags.get(_EXPIRES, "inf"))
    except ValueError:
        expires = float("inf")
    if expires < time.time():
        return True
    if tags.get(_HOST) != socket.gethostname():
        return False
    try:
        os.kill(int(tags.get(_PID, "0")), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


def _lock_models(lineage: LineageRecorder, model: str) -> list[RegisteredModel]:
    """Every registered model that takes or took the lock of ``model``: ``<prefix>.<token>``
    ones, and ``<prefix>`` as older versions named it."""
    prefix = f"{LOCK_PREFIX}{model}"
    found: list[RegisteredModel] = []
    page_token = None
    while True:
        page = lineage.call("search_registered_models", filter_string=f"name LIKE '{LOCK_PREFIX}%'",
                            max_results=1000, page_token=page_token)
        found += [m for m in page if m.name == prefix or (
            m.name.startswith(f"{prefix}.") and _LOCK_TOKEN.fullmatch(m.name[len(prefix) + 1:]))]
        page_token = page.token
        if not page_token:
            return sorted(found, key=lambda m: m.creation_timestamp or 0)


def _delete(lineage: LineageRecorder, name: str) -> bool:
    """Delete the registered model ``name``; False when it did not exist."""
    from mlflow.exceptions import MlflowException

    try:
        lineage.call("delete_registered_model", name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return False
    return True


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
    with registry_lock(lineage, model, lock_timeout_s) as lock:
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
        lock.check()
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
