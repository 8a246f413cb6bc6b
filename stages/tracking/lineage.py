"""The lineage recorder: the only module that talks to MLflow.

One experiment per pipeline, one parent run per pipeline run, one child run per stage. Metrics
go out in batches (``log_batch``), never one HTTP call per value. Experiments are created as
model-training experiments (:data:`EXPERIMENT_KIND`).
The policy is registered as an MLflow 3 LoggedModel in the ONNX flavor
(stages/tracking/mlflow_model.py), and its model version carries tags that point to the dataset, sim
report and bundle digests in the artifact store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from physai_core.errors import ConfigError, PhysaiError, TransientError
from stages.core.crash import crash_point
from stages.tracking.schema_cache import seed_mlflow_database

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient

    from stages.artifacts.records import ArtifactBase, Dataset
    from stages.tracking.mlflow_model import PolicyModel

log = logging.getLogger(__name__)

_BATCH = 900
PARENT_TAG = "mlflow.parentRunId"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow's kind of a model-training experiment (runs and models, not traces), set at creation
so the UI need not infer or ask for it. Which view MLflow 3.17's UI opens an experiment on
(runs, or the GenAI overview) follows its GenAI / Model training switch, which a browser
keeps, and a ``workflowType=machine_learning`` URL parameter; docs/registry.md."""
NOTE_TAG = "mlflow.note.content"
"""The description MLflow's UI shows for a run or logged model."""
_T = TypeVar("_T")


@dataclass(frozen=True)
class ModelRef:
    """A registered model version and everything its tags say about where it came from."""

    name: str
    version: str
    run_id: str | None
    source: str
    aliases: tuple[str, ...]
    tags: Mapping[str, str]


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """Split ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` into (name, alias, version)."""
    if not uri.startswith("models:/"):
        raise ConfigError.one("<argument>", "model_uri", uri, "expected models:/NAME@ALIAS")
    rest = uri.removeprefix("models:/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, None
    name, _, version = rest.partition("/")
    if not name or not version:
        raise ConfigError.one("<argument>", "model_uri", uri, "expected models:/NAME/VERSION")
    return name, None, version


class StageRun:
    """An MLflow run of one stage; logs are batched and sent on :meth:`flush`."""

    def __init__(self, recorder: LineageRecorder, run_id: str) -> None:
        self.recorder = recorder
        self.run_id = run_id
        self._metrics: list[Any] = []

    def log_params(self, params: Mapping[str, object]) -> None:
        """Log parameters (flattened, stringified) in one call."""
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self.recorder.call("log_batch", self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Queue metrics; they are sent with the next :meth:`flush`."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._metrics.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if len(self._metrics) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Send queued metrics in batches."""
        while self._metrics:
            batch, self._metrics = self._metrics[:_BATCH], self._metrics[_BATCH:]
            self.recorder.call("log_batch", self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, object]) -> None:
        """Set run tags in one call."""
        from mlflow.entities import RunTag

        self.recorder.call(
            "log_batch", self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()]
        )

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file to the run's artifacts."""
        self.recorder.call("log_artifact", self.run_id, str(path), artifact_path)

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        """Upload a dict as a JSON or YAML artifact."""
        self.recorder.call("log_dict", self.run_id, data, artifact_file)

    def log_figure(self, figure: Figure, artifact_file: str) -> None:
        """Upload a matplotlib figure."""
        self.recorder.call("log_figure", self.run_id, figure, artifact_file)

    def log_dataset(self, dataset: Dataset, context: str) -> None:
        """Record ``dataset`` as an input of this run (``mlflow.log_input``)."""
        from mlflow.entities import Dataset as MlflowDataset
        from mlflow.entities import DatasetInput, InputTag

        entity = MlflowDataset(
            name=f"{dataset.task}-demos",
            digest=dataset.digest[:36],
            source_type="physai-store",
            source=dataset.uri,
            schema=None,
            profile=f'{{"episodes": {dataset.episodes}, "transitions": {dataset.transitions}}}',
        )
        tags = [InputTag("mlflow.data.context", context)]
        # MLflow checks for the dataset, then inserts it: two runs logging one dataset at once
        # can both miss it, and the second insert fails its unique key. Logged again, the input
        # finds the row the other run wrote, so a conflict here is retried, never reported.
        self.recorder.call_idempotent(
            "log_inputs", self.run_id, [DatasetInput(entity, tags)],
            on_conflict=lambda: self.recorder.call(
                "log_inputs", self.run_id, [DatasetInput(entity, tags)]),
        )


class LineageRecorder:
    """Talks to one MLflow tracking server or database; the MLflow client is built lazily."""

    def __init__(self, tracking_uri: str, artifact_root: Path | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.shown_uri = without_credentials(tracking_uri)
        """The tracking URI as messages and links show it: without a user or password."""
        self.artifact_root = artifact_root
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        """The MLflow client, created on first use."""
        if self._client is None:
            import mlflow
            from mlflow import MlflowClient

            # Registering a LoggedModel resolves ``models:/m-...`` through the global URI.
            mlflow.set_tracking_uri(self.tracking_uri)
            mlflow.set_registry_uri(self.tracking_uri)
            for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent"):
                logging.getLogger(name).setLevel(logging.WARNING)
            seed_mlflow_database(self.tracking_uri)
            self._client = MlflowClient(self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call an MLflow client method, retrying connection faults with backoff."""
        return self.retrying(method, lambda: getattr(self.client, method)(*args, **kwargs))

    def retrying(self, what: str, action: Callable[[], _T]) -> _T:
        """Run ``action`` (MLflow calls named ``what`` in messages), retrying connection faults
        with backoff; after the last try a fault is a :class:`TransientError`."""
        from mlflow.exceptions import MlflowException
        from requests.exceptions import ConnectionError as RequestsConnectionError

        delay = 0.5
        for attempt in range(6):
            try:
                return action()
            except (RequestsConnectionError, MlflowException) as exc:
                if not _is_transient(exc) or attempt == 5:
                    if _is_transient(exc):
                        raise TransientError(f"MLflow at {self.shown_uri}: {exc}") from exc
                    raise
                log.warning("MLflow %s failed (%s); retrying in %.1fs", what, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)
        raise PhysaiError("unreachable")

    def call_idempotent(
        self, method: str, *args: Any, on_conflict: Callable[[], Any], **kwargs: Any
    ) -> Any:
        """:meth:`call` for a write another run may make at the same moment.

        When the write collides with a record that already exists (a unique key, an
        "already exists" answer), ``on_conflict`` is called instead: it reads or rewrites the
        record that won, so an identical concurrent write is success. Any other failure is
        raised as :meth:`call` raises it."""
        from mlflow.exceptions import MlflowException

        try:
            return self.call(method, *args, **kwargs)
        except MlflowException as exc:
            if not is_conflict(exc):
                raise
            log.info("MLflow %s met a concurrent identical write; reusing it", method)
            return on_conflict()

    def experiment_id(self, name: str) -> str:
        """Id of the experiment ``name``, created as a model-training experiment if missing;
        one that exists without an :data:`EXPERIMENT_KIND_TAG` (made before the tag was set
        here) gets it, one whose kind someone chose keeps it."""
        exp = self.call("get_experiment_by_name", name)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in exp.tags:
                self.call("set_experiment_tag", exp.experiment_id, EXPERIMENT_KIND_TAG,
                          EXPERIMENT_KIND)
            return str(exp.experiment_id)
        location = None
        if self.artifact_root is not None:
            location = (self.artifact_root / name).absolute().as_uri()
        return str(self.call_idempotent(
            "create_experiment", name, artifact_location=location,
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            on_conflict=lambda: self.call("get_experiment_by_name", name).experiment_id,
        ))

    def start_run(
        self,
        experiment: str,
        run_name: str,
        tags: Mapping[str, object] | None = None,
        parent_run_id: str | None = None,
    ) -> StageRun:
        """Create a run (a child of ``parent_run_id`` when given)."""
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = self.call(
            "create_run", self.experiment_id(experiment), tags=all_tags, run_name=run_name
        )
        crash_point(f"mlflow.run_created.{run_name.replace(' ', '_')}")
        return StageRun(self, run.info.run_id)

    @contextmanager
    def stage_run(
        self, experiment: str, stage: str, parent_run_id: str, tags: Mapping[str, object]
    ) -> Iterator[StageRun]:
        """A child run for one stage, ended FINISHED or FAILED with the block."""
        run = self.start_run(experiment, stage, {"physai.stage": stage, **tags}, parent_run_id)
        try:
            yield run
        except BaseException:
            run.flush()
            self.call("set_terminated", run.run_id, "FAILED")
            raise
        run.flush()
        crash_point(f"mlflow.run_ending.{stage}")
        self.call("set_terminated", run.run_id, "FINISHED")

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Terminate a run."""
        self.call("set_terminated", run_id, status)

    def end_abandoned(self, run_id: str) -> bool:
        """Mark a run KILLED if it is still RUNNING (its process died); True if it was."""
        if self.call("get_run", run_id).info.status != "RUNNING":
            return False
        self.call("set_terminated", run_id, "KILLED")
        return True

    def run_url(self, run_id: str) -> str:
        """A URL for the run in the MLflow UI (or the command that opens one)."""
        run = self.call("get_run", run_id)
        path = f"#/experiments/{run.info.experiment_id}/runs/{run_id}"
        if self.tracking_uri.startswith(("http://", "https://")):
            return f"{self.shown_uri.rstrip('/')}/{path}"
        return f"http://127.0.0.1:5000/{path}"

    def register_policy(
        self, model_name: str, model: PolicyModel, run_id: str, tags: Mapping[str, str]
    ) -> str:
        """Log ``model`` as a LoggedModel in the ONNX flavor with its metrics, and register it
        with ``tags``; both carry the gate table as description. Returns the new version."""
        from mlflow.entities import Metric

        from stages.tracking.mlflow_model import log_onnx_model

        run = self.call("get_run", run_id)
        logged = self.call(
            "create_logged_model",
            run.info.experiment_id,
            name=model_name,
            source_run_id=run_id,
            tags={**{k: v for k, v in tags.items() if k.startswith("physai.")},
                  NOTE_TAG: model.description},
            model_type="onnx-policy",
        )
        crash_point("register.logged_model_created")
        self.retrying("log_model", lambda: log_onnx_model(model, logged.model_id, run_id,
                                                          self.tracking_uri))
        crash_point("register.artifacts_logged")
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, 0, model_id=logged.model_id, run_id=run_id)
                   for k, v in model.metrics.items()]
        for i in range(0, len(metrics), _BATCH):
            self.call("log_batch", run_id, metrics=metrics[i : i + _BATCH])
        self._ensure_registered_model(model_name)
        version = self.call(
            "create_model_version",
            model_name,
            source=f"models:/{logged.model_id}",
            run_id=run_id,
            tags=dict(tags),
            description=model.description,
            model_id=logged.model_id,
        )
        crash_point("register.version_created")
        return str(version.version)

    def _ensure_registered_model(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.call_idempotent("create_registered_model", name,
                                 on_conflict=lambda: self.call("get_registered_model", name))

    def set_alias(self, model_name: str, alias: str, version: str) -> None:
        """Point ``model_name@alias`` at ``version``."""
        self.call("set_registered_model_alias", model_name, alias, version)

    def set_version_tags(self, model_name: str, version: str, tags: Mapping[str, str]) -> None:
        """Set tags on a model version."""
        for key, value in tags.items():
            self.call("set_model_version_tag", model_name, version, key, value)

    def resolve_model(self, uri: str) -> ModelRef:
        """Look up ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``."""
        from mlflow.exceptions import MlflowException

        name, alias, version = parse_model_uri(uri)
        try:
            if alias is not None:
                mv = self.client.get_model_version_by_alias(name, alias)
            else:
                mv = self.client.get_model_version(name, str(version))
        except MlflowException as exc:
            raise PhysaiError(f"{uri}: not found in the MLflow registry at "
                              f"{self.shown_uri}") from exc
        return ModelRef(
            name=mv.name,
            version=str(mv.version),
            run_id=mv.run_id,
            source=str(mv.source),
            aliases=tuple(mv.aliases),
            tags=dict(mv.tags),
        )

    def find_alias(self, model_name: str, alias: str) -> ModelRef | None:
        """The version ``model_name@alias`` points at, or None when there is none yet."""
        from mlflow.exceptions import MlflowException

        try:
            self.call("get_model_version_by_alias", model_name, alias)
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        return self.resolve_model(f"models:/{model_name}@{alias}")

    def run_info(self, run_id: str) -> tuple[str, Mapping[str, str]]:
        """The run's name and tags."""
        run = self.call("get_run", run_id)
        return run.info.run_name, dict(run.data.tags)


def artifact_tags(prefix: str, artifact: ArtifactBase) -> dict[str, str]:
    """Tags that point from an MLflow entity to an artifact in the store."""
    return {f"physai.{prefix}.digest": artifact.digest, f"physai.{prefix}.uri": artifact.uri}


def without_credentials(uri: str) -> str:
    """``uri`` without the ``user:password@`` part of its address, if it has one: what comes
    before the last ``@`` ahead of the first ``/``, ``?`` or ``#`` after ``scheme://``. The
    whole value is one address, so a password holding a quote or a space goes too (unlike
    :func:`stages.core.redaction.strip_url_credentials`, which finds URLs in free text); a malformed
    one (``http://[::1``) is cut the same way, not refused."""
    scheme, sep, rest = uri.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    return f"{scheme}://{rest[at + 1:]}" if sep and at >= 0 else uri


_CONFLICT_MARKS = (
    "UNIQUE constraint failed",  # SQLite
    "duplicate key value violates unique constraint",  # PostgreSQL
    "Duplicate entry",  # MySQL
    "already exists",
)


def is_conflict(exc: BaseException) -> bool:
    """Whether an MLflow error says the record being written already exists."""
    if getattr(exc, "error_code", None) == "RESOURCE_ALREADY_EXISTS":
        return True
    text = str(exc)
    return any(mark in text for mark in _CONFLICT_MARKS)


def _is_transient(exc: BaseException) -> bool:
    from requests.exceptions import ConnectionError as RequestsConnectionError

    if isinstance(exc, RequestsConnectionError):
        return True
    text = str(exc)
    return any(s in text for s in ("Max retries exceeded", "Connection refused", " 503", " 502"))
