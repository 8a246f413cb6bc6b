"""``flows policy serve``: any policy this project can run, served over OpenPI's websocket
policy protocol (openpi-client's ``WebsocketClientPolicy`` talks to it): an edge bundle, or
anything ``flows validate`` takes. Beyond loopback it needs an API key unless
``--allow-no-key`` says otherwise."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from flows.policy_cli import (
    POLICY_HELP,
    bundle_trust,
    import_mapped,
    input_flags,
    obs_key_flag,
    port_number,
    positive,
    refuse_unknown,
    trust_flags,
    units_flag,
)

if TYPE_CHECKING:
    from stages.policies.policy_server import ServerLimits
    from stages.sim.tasks.catalog import TaskSpec
    from stages.training.policy_reference import ResolvedPolicy

MAX_KEY_BYTES = 64 * 2**10
"""Largest ``--api-key-file`` read: a key is one line of well under a KiB."""


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    """Serve a policy over OpenPI's websocket protocol until interrupted.

    Steps: 1. the server's limits, and an open server refused before anything loads; 2. the
    policy and what the server tells a client; 3. the server on its own thread, stopped by
    SIGINT or SIGTERM; 4. one line saying what is served where, then serve until stopped.
    """
    import math
    import signal
    import threading

    from stages.policies import policy_server

    # -- 1. the limits
    limits = _server_limits(args)
    if limits.api_key is None:
        _refuse_open_server(args.host, args.allow_no_key)
    with tempfile.TemporaryDirectory(prefix="physai-serve-") as work:
        # -- 2. the policy and its metadata
        act, metadata = _served_policy(args, Path(work))
        metadata["max_batch"] = limits.max_batch
        # -- 3. the server's thread
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        ready = threading.Event()
        thread = threading.Thread(target=policy_server.serve,
                                  args=(act, metadata, args.host, args.port),
                                  kwargs={"ready": ready, "stop": stop, "limits": limits},
                                  daemon=True)
        thread.start()
        if not ready.wait(30):
            from physai_core.errors import PhysaiError

            raise PhysaiError(f"flows policy serve: could not listen on {args.host}:{args.port}")
        # -- 4. what is served where
        images = metadata.get("image_shapes", {})
        reads = ", ".join(f"{key} ({'x'.join(map(str, images[key]))})" if key in images
                          else key for key in metadata["keys"].values())
        frame = limits.max_frame_bytes(int(metadata["obs_dim"]),
                                       sum(math.prod(shape) for shape in images.values()))
        print(f"serving {args.policy} ({metadata['task']}, policy {metadata['policy_digest'][:12]}"
              f") on ws://{args.host}:{args.port}; reads {reads}; at most "
              f"{limits.max_connections} clients, {limits.max_batch} observations a call, "
              f"{frame} bytes a frame, {limits.call_timeout_s:g} s a call; "
              f"{'API key required' if limits.api_key else 'no API key'}",
              file=sys.stderr, flush=True)
        thread.join()
    return 0


def _refuse_open_server(host: str, allow_no_key: bool) -> None:
    """Refuse to serve with no API key on ``host`` unless every address it resolves to is a
    loopback one, or ``--allow-no-key`` says to (then a warning line): one line naming
    ``--host`` and its value, exit status 2, before anything is loaded or bound."""
    from physai_core.errors import ConfigError
    from stages.policies.wire import API_KEY_VAR

    beyond = beyond_loopback(host)
    if beyond is None:
        return
    if not allow_no_key:
        raise ConfigError.one("flows policy serve", "--host", host,
                              f"{beyond}: with no API key anyone who reaches it could call the "
                              f"policy; give --api-key-file FILE or ${API_KEY_VAR}, or "
                              "--allow-no-key to serve it open")
    print(f"warning: serving on {host} with no API key ({beyond}; --allow-no-key): anyone who "
          "reaches this address may call the policy", file=sys.stderr, flush=True)


def beyond_loopback(host: str) -> str | None:
    """Why serving on ``host`` may answer other machines, or None when every address it
    resolves to (:func:`socket.getaddrinfo`, as the server binds it) is a loopback one:
    ``localhost``, ``127.0.0.2`` and ``::1`` are; ``0.0.0.0``, ``::``, a name resolving
    elsewhere and one that does not resolve are not."""
    import ipaddress
    import socket

    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"it does not resolve to an address ({type(exc).__name__})"

    def loopback(address: str) -> bool:
        try:
            return ipaddress.ip_address(address.partition("%")[0]).is_loopback
        except ValueError:
            return False

    outside = sorted({str(info[4][0]) for info in found if not loopback(str(info[4][0]))})
    if not found or outside:
        return f"it resolves to {', '.join(outside) or 'no address'}, beyond loopback"
    return None


def _server_limits(args: argparse.Namespace) -> ServerLimits:
    """The server's :class:`stages.policies.policy_server.ServerLimits` from the flags; the API
    key from ``--api-key-file`` or ``$PHYSAI_POLICY_API_KEY`` (never printed)."""
    from physai_core.errors import ConfigError
    from stages.core.loading import read_capped
    from stages.policies.policy_server import ServerLimits
    from stages.policies.wire import API_KEY_VAR

    key = os.environ.get(API_KEY_VAR, "").strip() or None
    if args.api_key_file is not None:
        raw = read_capped(args.api_key_file, MAX_KEY_BYTES, "--api-key-file")
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError.one(args.api_key_file, "--api-key-file", str(args.api_key_file),
                                  "cannot read the key (not UTF-8)") from None
        if not key or len(key.splitlines()) != 1:
            raise ConfigError.one(args.api_key_file, "--api-key-file", str(args.api_key_file),
                                  "the file must hold the key on one line")
    return ServerLimits(max_batch=args.max_batch, max_connections=args.max_connections,
                        call_timeout_s=args.call_timeout, api_key=key)


def _served_policy(args: argparse.Namespace, work: Path) -> tuple[Any, dict[str, Any]]:
    """The policy ``args.policy`` names and the metadata the server sends: a bundle (its
    verified ONNX; a bundle file, or one the store holds by its digest, signed with the trust
    key unless ``--allow-unsigned``), or anything ``flows validate`` takes (``--task`` for a
    bare file)."""
    from flows.servers import prepare_environment
    from stages.artifacts.records import EdgeBundle
    from stages.orchestration.context import open_services
    from stages.sim.tasks.catalog import get_task
    from stages.training.import_sources import is_mlflow_uri
    from stages.training.policy_reference import is_bundle, open_bundle, resolve_policy

    ref = args.policy
    refuse_unknown([ref])
    trust_key = bundle_trust(args)
    if not is_mlflow_uri(ref) and is_bundle(Path(ref)):
        resolved, task = open_bundle(Path(ref), work, trust_key=trust_key,
                                     allow_unsigned=args.allow_unsigned)
    else:
        prepare_environment()
        _, store, lineage = open_services()
        digest = ref.removeprefix("sha256:")
        stored = store.get(digest) if len(digest) == 64 and store.has(digest) else None
        if isinstance(stored, EdgeBundle):
            resolved, task = open_bundle(store.open_payload(stored), work, trust_key=trust_key,
                                         allow_unsigned=args.allow_unsigned, shown=ref)
            return resolved.act, _metadata(get_task(task), resolved, args.obs_key)
        task = args.task or _policy_task(ref, store, lineage)
        resolved = import_mapped(ref, get_task(task), lineage, args, work) or resolve_policy(
            ref, get_task(task), store, lineage, trust_code=args.trust_code, work=work,
            trust_key=trust_key, allow_unsigned=args.allow_unsigned,
            action_units=args.action_units)
    return resolved.act, _metadata(get_task(task), resolved, args.obs_key)


def _metadata(spec: TaskSpec, resolved: ResolvedPolicy,
              obs_keys: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """What the server sends a client on connecting: the task, its sizes, the policy, the key
    of each input it reads (``--obs-key`` over :func:`stages.policies.wire.default_keys`), the
    shape of each image by its key, and a chunk policy's ``chunk_size``. A key naming no input of
    the policy, or an image input no camera of the task gives, is one line (exit status 2)."""
    from physai_core.errors import ConfigError
    from stages.policies.wire import key_map
    from stages.sim.env.observation import STATE_KEY, policy_inputs

    inputs = policy_inputs(resolved.act)
    try:
        keys = key_map(inputs, dict(obs_keys or []))
    except ValueError as exc:
        raise ConfigError.one(resolved.digest[:12], "--obs-key", dict(obs_keys or []),
                              str(exc)) from None
    shapes = {keys[key]: list(camera.shape(key)) for camera in spec.cameras
              for key in camera.tensors() if key in keys}
    unseen = [name for name in inputs if name != STATE_KEY and keys[name] not in shapes]
    if unseen:
        raise ConfigError.one(resolved.digest[:12], "inputs", unseen,
                              f"no camera of task {spec.name} gives them")
    meta = {"task": spec.name, "obs_dim": spec.obs_dim, "act_dim": spec.act_dim,
            "obs_names": list(spec.obs_names), "action_names": list(spec.action_names),
            "control_hz": spec.control_hz, "policy_digest": resolved.digest,
            "policy_kind": resolved.kind, "server": "physai-flows", "keys": keys}
    if shapes:
        meta["image_shapes"] = shapes
    chunk = getattr(resolved.act, "chunk_size", None)
    if isinstance(chunk, int) and chunk > 0:
        meta["chunk_size"] = chunk
    return meta


def _policy_task(ref: str, store: Any, lineage: Any) -> str:
    """The task of a policy in the store or the registry; a bare file needs ``--task``."""
    from physai_core.errors import ConfigError
    from stages.artifacts.records import Policy
    from stages.training.policy_reference import registered_model

    digest = ref.removeprefix("sha256:")
    if ref.startswith("models:/"):
        digest = registered_model(lineage, ref).tags.get("physai.policy.digest", "")
    if digest and store.has(digest):
        artifact = store.get(digest)
        if isinstance(artifact, Policy):
            return artifact.task
    raise ConfigError.one(ref, "--task", None, "name the policy's task (--task reach-v0): "
                          "it is neither a bundle nor a policy of this project's store")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows policy serve``."""
    pol = sub.add_parser("policy", help="serve a policy to robots and other harnesses")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    srv = pol_sub.add_parser("serve", help="serve a policy over OpenPI's websocket policy "
                             "protocol (openpi-client's WebsocketClientPolicy talks to it)")
    srv.add_argument("policy", help=f"an edge bundle (.tar), or {POLICY_HELP}")
    srv.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    srv.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1; "
                     "0.0.0.0 serves every interface); one that resolves beyond loopback "
                     "needs an API key (--api-key-file) or --allow-no-key")
    srv.add_argument("--task", default=None, help="the policy's task, for a bare ONNX or "
                     "TorchScript file")
    srv.add_argument("--trust-code", action="store_true",
                     help="admit a TorchScript file, which is code that runs when loaded")
    obs_key_flag(srv, "read the policy input INPUT (obs, <camera>_image) from the message "
                  "key KEY (its own name is read too); default: obs alone for a state "
                  "policy, else OpenPI's observation/state, observation/image (the first "
                  "camera), observation/wrist_image (a camera named wrist), "
                  "observation/<camera>_image")
    trust_flags(srv)
    units_flag(srv)
    input_flags(srv)
    from stages.policies import policy_server, wire
    srv.add_argument("--max-batch", type=positive(int), default=wire.DEFAULT_MAX_BATCH,
                     help="most observations in one call; a frame's size cap follows from "
                     f"it and the observation width (default {wire.DEFAULT_MAX_BATCH})")
    srv.add_argument("--max-connections", type=positive(int),
                     default=policy_server.DEFAULT_MAX_CONNECTIONS,
                     help=f"most clients at once (default {policy_server.DEFAULT_MAX_CONNECTIONS})")
    srv.add_argument("--call-timeout", type=positive(float),
                     default=policy_server.DEFAULT_CALL_TIMEOUT_S, metavar="S",
                     help="longest the policy may take over one call before the answer is "
                     f"an error (default {policy_server.DEFAULT_CALL_TIMEOUT_S:g} s)")
    srv.add_argument("--api-key-file", type=Path, default=None, metavar="FILE",
                     help="clients must send the key this file holds (openpi-client's "
                     f"api_key); default: ${wire.API_KEY_VAR} when set, else no key")
    srv.add_argument("--allow-no-key", action="store_true",
                     help="serve with no API key on a --host beyond loopback, where anyone "
                     "who reaches it may call the policy (a warning line); without it that "
                     "is refused, exit 2")
    srv.set_defaults(func=cmd_serve)
