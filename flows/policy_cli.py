"""Naming a policy and evaluating it over a scene suite, from the command line: what
``flows validate``, ``flows compare`` and ``flows policy serve`` share (flows/validate_cli.py,
flows/compare_cli.py, flows/serve_cli.py).

A policy is named by an ONNX or TorchScript file or Python code (``python:PACKAGE.MODULE:CALLABLE``,
a benchmark's scripted policy or a team's controller; both only with ``--trust-code``), an
edge bundle (a file or its digest: signed with ``--trust KEY``, by default this project's own
public key, or run unauthenticated with ``--allow-unsigned``), a policy digest in the artifact
store, or an MLflow model URI (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``: a version this
project registered runs its stored policy, any other enters through its onnx flavor;
``runs:/RUN_ID/PATH``). The task is the suite's. A suite whose backend lives in a stage
environment (``backend: isaaclab``) is evaluated in that environment's interpreter.
``--action-units native`` says that a policy file or MLflow model acts in the environment's own
units (its actions are mapped to the task's -1..1); ``--action-units normalized`` that it acts
in -1..1, which its probe actions must keep to (docs/policies.md).

Bad input (an unknown file, model, alias or digest among them) is one line and exit 2, with
nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from stages.artifacts.records import SweepCurve
    from stages.evaluation.rollout import Rollout
    from stages.evaluation.suite import Evaluation
    from stages.sections.models import ChunkConfig, ValidateConfig
    from stages.sim.suites.suite import Suite
    from stages.sim.tasks.catalog import TaskSpec
    from stages.tracking.lineage import LineageRecorder
    from stages.training.policy_reference import ResolvedPolicy


def _whole(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (None: no upper end);
    argparse exits 2 with the reason otherwise."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
        if n < low or (high is not None and n > high):
            bound = f"at least {low}" if high is None else f"{what}{low}-{high}"
            raise argparse.ArgumentTypeError(f"must be {bound} (value: {n})")
        return n

    return parse


episode_count = _whole(1)
"""``--episodes`` and ``--chunk``: a positive count."""


port_number = _whole(1, 65535, "a port, ")
"""A TCP port, 1-65535, refused before any server starts."""


def within(low: float, high: float, shown: str) -> Callable[[str], float]:
    """An argparse type: a number in the interval ``shown`` from ``low`` to ``high``, each end
    included where ``shown`` has a square bracket (``[0, 1)``)."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        above = x >= low if shown.startswith("[") else x > low
        below = x <= high if shown.endswith("]") else x < high
        if not (above and below):
            raise argparse.ArgumentTypeError(f"must be within {shown} (value: {x:g})")
        return x

    return parse


def positive(kind: type[int | float]) -> Any:
    """An argparse type: a positive ``kind`` (argparse exits 2 otherwise)."""
    def parse(value: str) -> int | float:
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {value!r}") from None
        if not x > 0:
            raise argparse.ArgumentTypeError(f"must be positive (value: {x})")
        return x

    return parse


def stdout_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[object]:
    """With ``--json``, whatever libraries print (MLflow's run links) goes to stderr, so
    stdout holds the one JSON object."""
    if args.json:
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


def evaluate_policies(refs: list[str], args: argparse.Namespace, quiet: bool,
              gates: ValidateConfig | None = None) -> list[Evaluation]:
    """Load the suite, resolve every policy of ``refs`` and run each over it (each scene
    stopping early where ``gates`` ask for a sequential gate). With ``gates`` (validate),
    every sweep point of the suite runs too. A suite whose backend lives in a stage
    environment (Isaac Lab's) is evaluated in that environment's interpreter, as a pipeline's
    validate stage does (:func:`stages.orchestration.envcall.validate_suite_in`)."""
    from flows.servers import prepare_environment
    from stages.orchestration.context import open_services
    from stages.sim.tasks.catalog import get_task
    from stages.training.policy_reference import resolve_policy

    register_tasks(args.tasks or [])
    suite = _suite(args.suite, bool(args.tasks))
    environment = _suite_environment(suite)
    spec = get_task(suite.config.task)
    refuse_unknown(refs)
    trust_key = bundle_trust(args)
    prepare_environment()
    _, store, lineage = open_services()
    out = []
    with tempfile.TemporaryDirectory(prefix="physai-policy-") as work:
        resolved = [import_mapped(ref, spec, lineage, args, Path(work))
                    or resolve_policy(ref, spec, store, lineage, trust_code=args.trust_code,
                                      work=Path(work), remote_timeout_s=args.remote_timeout,
                                      trust_key=trust_key, allow_unsigned=args.allow_unsigned,
                                      action_units=args.action_units)
                    for ref in refs]
        remote_inputs(resolved, spec, suite, args)
        if environment is not None:
            return _evaluate_there(environment, refs, resolved, suite, args, gates, Path(work))
        for ref, policy in zip(refs, resolved, strict=True):
            out.append(_evaluate_here(ref, policy, suite, args, quiet, gates))
    return out


def import_mapped(ref: str, spec: TaskSpec, lineage: LineageRecorder,
                  args: argparse.Namespace, work: Path) -> ResolvedPolicy | None:
    """The policy file or MLflow model ``ref`` imported with the inputs mapped as
    ``--input``, ``--image-layout`` and ``--image-range`` say (the ``import`` algorithm's
    ``inputs``, ``image_layout`` and ``image_range``), run from ``work``; None when no such
    flag is given or ``ref`` is another kind of policy (a digest, a bundle, a version registered
    here, a server, Python code), which ``resolve_policy`` resolves as it is."""
    from physai_core.errors import ConfigError
    from stages.core.code_refs import is_python_ref
    from stages.core.hashing import sha256_bytes
    from stages.policies.local import onnx_actor
    from stages.training.import_sources import Where, is_mlflow_uri
    from stages.training.imported import ImportConfig, import_policy
    from stages.training.policy_reference import ResolvedPolicy, is_bundle, registered_model

    given = (args.input, args.image_layout, args.image_range)
    if not any(given):
        return None
    stored_here = ref.startswith("models:/") and registered_model(lineage, ref).tags.get(
        "physai.policy.digest")
    if ref.startswith(("ws://", "wss://")) or is_python_ref(ref) or stored_here or (
            not is_mlflow_uri(ref) and (not Path(ref).exists() or is_bundle(Path(ref)))):
        flag = next(f for f, v in zip(("--input", "--image-layout", "--image-range"), given,
                                      strict=True) if v)
        raise ConfigError.one("command line", flag, ref, "maps the inputs of a policy file "
                              "or of an MLflow model not registered here; this policy already "
                              "reads the task's observation as it is: leave the flag out")
    inputs, layouts, ranges = (dict(pairs) if pairs else None for pairs in given)
    cfg = ImportConfig(source=ref, trust_code=args.trust_code, action_units=args.action_units,
                       inputs=inputs, image_layout=layouts, image_range=ranges)
    imported = import_policy(cfg, spec, base=Path.cwd(), where=Where(ref, "source"),
                             tracking_uri=lineage.tracking_uri)
    digest = sha256_bytes(imported.onnx)
    path = work / f"{digest}.onnx"
    path.write_bytes(imported.onnx)
    return ResolvedPolicy(onnx_actor(path), digest, imported.source_kind, path)


def remote_inputs(resolved: list[ResolvedPolicy], spec: TaskSpec, suite: Suite,
                  args: argparse.Namespace) -> None:
    """Tell every policy of ``resolved`` served over the network what to send it: the task's
    camera images beside the state, under ``--obs-key`` over the suite's ``remote.keys`` over
    the server's own keys (:meth:`stages.policies.remote.RemotePolicy.send_as`), and ``--prompt``,
    else the suite's ``remote.prompt``, for the scenes that give no ``instruction``. A refusal
    (a key naming no input, an image of another size than the server's) closes every connection
    and is one line, exit status 2."""
    from stages.policies.remote import RemotePolicy

    section = suite.config.remote
    keys = {**(section.keys if section else {}), **dict(args.obs_key or [])}
    prompt = args.prompt if args.prompt is not None else section.prompt if section else None
    images = {key: camera.shape(key) for camera in spec.cameras for key in camera.tensors()
              if key == camera.image_key or key in keys}
    try:
        for policy in resolved:
            if isinstance(policy.act, RemotePolicy):
                policy.act.send_as(images, keys or None, prompt)
    except Exception:
        for policy in resolved:
            close = getattr(policy.act, "close", None)
            if callable(close):
                close()
        raise


def register_tasks(refs: list[str]) -> None:
    """Register the task files ``--tasks`` names (paths relative to this folder, or
    ``pkg:PACKAGE/PATH``), as a pipeline config's ``tasks:`` does; a bad one is one line, exit
    status 2."""
    from physai_core.errors import ConfigError, Problem
    from stages.core.resources import resolve_file
    from stages.sim.tasks.template import register_task_file

    problems = []
    for ref in refs:
        try:
            path = resolve_file(ref, Path.cwd())
        except ValueError as exc:
            problems.append(Problem(ref, "--tasks", ref, str(exc)))
            continue
        if not path.is_file():
            problems.append(Problem(ref, "--tasks", ref, f"task file not found: {path}"))
            continue
        try:
            register_task_file(path)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)


def _suite(path: Path, tasks_given: bool) -> Suite:
    """The suite at ``path``; where its task is unknown and no ``--tasks`` was given, the
    message says how a task file's task is named."""
    from physai_core.errors import ConfigError, Problem
    from stages.sim.suites.loading import load_suite

    try:
        return load_suite(path)
    except ConfigError as exc:
        if tasks_given:
            raise
        raise ConfigError([
            Problem(p.file, p.field, p.value, f"{p.message} (a task a task file defines: "
                    "--tasks FILE)") if p.field == "task" and "unknown task" in p.message
            else p for p in exc.problems]) from None


def _evaluate_here(ref: str, policy: ResolvedPolicy, suite: Suite, args: argparse.Namespace,
                   quiet: bool, gates: ValidateConfig | None) -> Evaluation:
    """One policy over the suite in this process."""
    from flows.console import RichProgress
    from stages.evaluation.suite import Evaluation, evaluate_suite, evaluate_sweeps
    from stages.orchestration.context import NullProgress
    from stages.policies.local import run_chunks

    chunk = chunk_config(args)
    act = run_chunks(policy.act, chunk.how() if chunk is not None else None, CHUNK_FLAGS)
    progress: Any = NullProgress() if quiet else RichProgress(Console(stderr=True))
    curves: tuple[SweepCurve, ...] = ()
    rollouts: dict[str, Rollout] = {}
    with progress if not quiet else contextlib.nullcontext():
        scenes = evaluate_suite(suite, act, episodes=args.episodes, progress=progress,
                                gates=gates, rollouts=rollouts)
        if gates is not None and suite.sweeps:
            curves = evaluate_sweeps(suite, act, episodes=args.episodes,
                                     progress=progress)
    latency = getattr(policy.act, "latency_summary", None)
    close = getattr(policy.act, "close", None)
    if callable(close):
        close()
    return Evaluation(ref, policy.digest, policy.kind, suite, scenes,
                      latency() if callable(latency) else {}, curves, rollouts)


CHUNK_FLAGS = "--chunk-execute/--chunk-ensemble"
"""How a chunk setting of the command line is named in a message."""


def chunk_config(args: argparse.Namespace) -> ChunkConfig | None:
    """``--chunk-execute N`` or ``--chunk-ensemble M`` as ``validate.chunk``; None for
    neither (a chunk policy then runs all of each chunk)."""
    from stages.sections.models import ChunkConfig

    if args.chunk_execute is not None:
        return ChunkConfig(execute=args.chunk_execute)
    if args.chunk_ensemble is not None:
        return ChunkConfig(ensemble=args.chunk_ensemble)
    return None


def _evaluate_there(environment: str, refs: list[str], resolved: list[ResolvedPolicy],
                    suite: Suite, args: argparse.Namespace, gates: ValidateConfig | None,
                    work: Path) -> list[Evaluation]:
    """The policies over the suite in the stage environment ``environment``, one interpreter
    for all: their policy files go there, the scenes' results come back."""
    from physai_core.errors import ConfigError
    from stages.evaluation.suite import Evaluation
    from stages.orchestration.envcall import validate_suite_in

    paths = []
    for ref, policy in zip(refs, resolved, strict=True):
        if policy.crosses is None:
            for each in resolved:
                close = getattr(each.act, "close", None)
                if callable(close):
                    close()
            raise ConfigError.one(str(suite.path), "backend", suite.config.backend,
                                  f"runs in the stage environment {environment!r}, where a "
                                  f"policy served over the network ({ref}) is not evaluated: "
                                  "validate its file, digest or model instead")
        paths.append(policy.crosses)
    there = validate_suite_in(environment, suite.path, paths, episodes=args.episodes,
                              gates=gates, sweeps=gates is not None, scratch=work)
    return [Evaluation(ref, policy.digest, policy.kind, suite, e.scenes, {}, e.sweeps)
            for ref, policy, e in zip(refs, resolved, there, strict=True)]


def _suite_environment(suite: Suite) -> str | None:
    """The stage environment the suite's backend runs in, when not this process; its
    interpreter must be there (one line naming what builds it, exit status 2)."""
    from stages.core.environments import require_python, runs_here
    from stages.sim.backends.catalog import get_backend

    environment = get_backend(suite.config.backend).environment
    if runs_here(environment):
        return None
    require_python(str(environment), f"{suite.path}: backend {suite.config.backend}")
    return environment


def refuse_unknown(refs: list[str]) -> None:
    """Refuse, before any state is created, a policy reference that can name nothing: a file
    that is not there, or a model or digest while this project has no registry or store yet
    (exit status 2, nothing written)."""
    from physai_core.errors import ConfigError
    from stages.core.settings import resolve_settings
    from stages.training.import_sources import is_mlflow_uri
    from stages.training.policy_reference import check_reference

    settings = resolve_settings()
    database = settings.tracking_uri.removeprefix("sqlite:///")
    # Without a state folder no local server is running that could name another registry.
    no_registry = (settings.tracking_uri.startswith("sqlite:///") and not Path(database).exists()
                   and ("MLFLOW_TRACKING_URI" in os.environ or not settings.home.exists()))
    no_store = "://" not in settings.store_uri and not Path(settings.store_uri).is_dir()
    for ref in refs:
        check_reference(ref)
        if is_mlflow_uri(ref) and no_registry:
            raise ConfigError.one(ref, "", ref, f"no such model: this project has no MLflow "
                                  f"registry yet ({database} does not exist)")
        digest = ref.removeprefix("sha256:")
        if len(digest) == 64 and not Path(ref).exists() and no_store:
            raise ConfigError.one(ref, "", ref, f"no such artifact: this project has no store "
                                  f"yet ({settings.store_uri} does not exist)")


def bundle_trust(args: argparse.Namespace) -> Path | None:
    """The public key a bundle named as a policy must be signed with: ``--trust``, else the
    project's own (``stages.steps.bundles.default_trust_key``), else none (then only
    ``--allow-unsigned`` admits a bundle); none with ``--allow-unsigned``."""
    from physai_core.errors import ConfigError
    from stages.steps.bundles import default_trust_key

    if args.allow_unsigned:
        return None
    if args.trust is not None:
        if not args.trust.is_file():
            raise ConfigError.one(args.trust, "--trust", str(args.trust),
                                  "no such public key file")
        return Path(args.trust)
    return default_trust_key()


def latency_line(latency: Mapping[str, float]) -> str:
    """A remote policy's call latencies in one line (``remote_latency_ms`` of the JSON)."""
    return (f"remote policy: {int(latency['calls'])} calls, p50 {latency['p50_ms']:.2f} ms, "
            f"p99 {latency['p99_ms']:.2f} ms, max {latency['max_ms']:.2f} ms a call")


POLICY_HELP = ("an ONNX or TorchScript file, a policy digest in the store, models:/NAME/"
               "VERSION, models:/NAME@ALIAS, runs:/RUN_ID/PATH, or Python code "
               "python:PACKAGE.MODULE:CALLABLE (with --trust-code)")


def common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that validate and compare share."""
    parser.add_argument("--suite", required=True, type=Path,
                        help="scene suite file; its task is the policy's task")
    parser.add_argument("--episodes", type=episode_count, default=None,
                        help="episodes per scene (default: the suite's)")
    parser.add_argument("--trust-code", action="store_true",
                        help="admit a TorchScript file or Python code (python:...), which "
                        "run code when loaded")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--tasks", action="append", default=None, metavar="FILE",
                        help="a task file to register first, as a pipeline config's tasks: "
                        "does (the suite's task when a task file defines it, e.g. "
                        "sim_scenes/pusher_reach/task.yaml); repeatable")
    parser.add_argument("--remote-timeout", type=float, default=5.0, metavar="S",
                        help="for a ws:// policy server: longest wait for one answer before "
                        "the call's episodes count as failed (default 5 s)")
    obs_key_flag(parser, "for a ws:// policy server: send the policy input INPUT (obs, "
                  "<camera>_image) as KEY, e.g. front_image=observation/image; over the "
                  "suite's remote.keys, the server's own keys, else OpenPI's "
                  "(observation/state, observation/image, observation/wrist_image)")
    parser.add_argument("--prompt", default=None, metavar="TEXT",
                        help="for a ws:// policy server: the instruction sent as prompt "
                        "with every observation of a scene that names none (a scene's "
                        "instruction wins; default: the suite's remote.prompt)")
    chunks = parser.add_mutually_exclusive_group()
    chunks.add_argument("--chunk-execute", type=positive(int), default=None, metavar="N",
                        help="a policy that emits chunks of actions runs the first N of each "
                        "chunk, then is asked again (default: all of each chunk)")
    chunks.add_argument("--chunk-ensemble", type=_non_negative, default=None, metavar="M",
                        help="a policy that emits chunks is asked every step, and acts on "
                        "ACT's temporal ensembling of its chunks (the i-th oldest weighs "
                        "exp(-M i); ACT's default M is 0.01)")
    trust_flags(parser)
    units_flag(parser)
    input_flags(parser)


def _non_negative(value: str) -> float:
    """A finite number of at least 0 (argparse exits 2 otherwise)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (x >= 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (value: {x})")
    return x


def _obs_key(value: str) -> tuple[str, str]:
    """``--obs-key INPUT=KEY`` (argparse exits 2 otherwise)."""
    name, _, key = value.partition("=")
    if not name.strip() or not key.strip():
        raise argparse.ArgumentTypeError(f"expected INPUT=KEY, e.g. "
                                         f"front_image=observation/image (value: {value!r})")
    return name.strip(), key.strip()


def obs_key_flag(parser: argparse.ArgumentParser, text: str) -> None:
    """``--obs-key INPUT=KEY``, repeatable: the message key of a policy input."""
    parser.add_argument("--obs-key", type=_obs_key, action="append", default=None,
                        metavar="INPUT=KEY", help=f"{text}; repeatable")


def _input(value: str) -> tuple[str, str | tuple[int | str, ...]]:
    """``--input NAME=TENSOR`` (``obs`` or ``<camera>_image``) or ``NAME=ENTRY,ENTRY,...``
    (state entries by name or 0-based index); argparse exits 2 otherwise."""
    name, _, read = (part.strip() for part in value.partition("="))
    entries = [e.strip() for e in read.split(",")]
    if not name or not all(entries):
        raise argparse.ArgumentTypeError(f"expected NAME=obs, NAME=<camera>_image or "
                                         f"NAME=ENTRY,ENTRY,... (value: {value!r})")
    if len(entries) == 1 and (read == "obs" or read.endswith("_image")):
        return name, read
    return name, tuple(int(e) if e.isdigit() else e for e in entries)


def _named(choices: tuple[str, ...]) -> Callable[[str], tuple[str, str]]:
    """An argparse type: ``NAME=CHOICE``, CHOICE one of ``choices``."""

    def parse(value: str) -> tuple[str, str]:
        name, _, choice = (part.strip() for part in value.partition("="))
        if not name or choice not in choices:
            raise argparse.ArgumentTypeError(f"expected NAME={'|'.join(choices)} (value: "
                                             f"{value!r})")
        return name, choice

    return parse


def input_flags(parser: argparse.ArgumentParser) -> None:
    """``--input``, ``--image-layout`` and ``--image-range``, each repeatable: how the inputs
    of a policy file or MLflow model map to the task's observation (the ``import`` algorithm's
    ``inputs``, ``image_layout`` and ``image_range``, docs/policies.md)."""
    from stages.training.import_images import LAYOUTS, RANGES

    parser.add_argument("--input", type=_input, action="append", default=None,
                        metavar="NAME=ENTRY",
                        help="the policy file's input NAME reads the task's ENTRY: obs (the "
                        "state), a camera image <camera>_image, or state entries ENTRY,ENTRY,... "
                        "(names or 0-based indices); inputs named obs or <camera>_image map "
                        "themselves; repeatable")
    parser.add_argument("--image-layout", type=_named(LAYOUTS), action="append", default=None,
                        metavar="NAME=hwc|chw",
                        help="where the policy file's image input NAME has its channels, "
                        "where its graph does not say; repeatable")
    parser.add_argument("--image-range", type=_named(RANGES), action="append", default=None,
                        metavar="NAME=0..1|0..255",
                        help="the pixel values the policy file's float image input NAME takes "
                        "(default 0..1; a uint8 input takes 0..255); repeatable")


def units_flag(parser: argparse.ArgumentParser) -> None:
    """``--action-units``: the units of the actions of a policy file or MLflow model."""
    from stages.core.units import UNITS

    parser.add_argument("--action-units", choices=UNITS, default=None,
                        help="the units a policy file's or MLflow model's actions are in: "
                        "native (the environment's own; mapped to the task's -1..1) or "
                        "normalized (-1..1; probe actions beyond are refused); default: taken "
                        "as normalized, unchecked. Policies stored here, bundles and servers "
                        "act in the task's convention already")


def trust_flags(parser: argparse.ArgumentParser) -> None:
    """``--trust`` or ``--allow-unsigned``: how a bundle named as a policy is admitted."""
    trust = parser.add_mutually_exclusive_group()
    trust.add_argument("--trust", type=Path, default=None, metavar="KEY",
                       help="a bundle must be signed with this public key's private key "
                       "(default: this project's own public key)")
    trust.add_argument("--allow-unsigned", action="store_true",
                       help="run a bundle that is unsigned or signed by another key, "
                       "unauthenticated (a warning line each time)")
