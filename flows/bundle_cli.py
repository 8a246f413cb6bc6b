"""``flows bundle verify|inspect|pull|drive``: an edge bundle checked, shown, fetched from the
registry or the store, or driven on a simulated robot through the on-robot runtime."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from edge.runtime import BundleBytes


def cmd_bundle(args: argparse.Namespace, console: Console) -> int:
    """Verify a bundle's every digest, or print what it holds."""
    from edge.bundle import read_manifest
    from physai_core.errors import ConfigError

    path = Path(args.file)
    if args.allow_unsigned and args.action not in ("drive", "verify"):
        raise ConfigError.one(path, "--allow-unsigned", True, "only bundle drive and verify "
                              "take it (and flows engine build): inspect and pull vouch for "
                              "nothing")
    if args.action == "drive":
        return _drive_bundle(args, path, console)
    if args.action == "pull":
        return _pull_bundle(args, console)
    if args.trust and args.action == "inspect":
        raise ConfigError.one(path, "--trust", args.trust, "bundle inspect checks nothing; "
                              "use bundle verify --trust")
    if args.against and args.action != "verify":
        raise ConfigError.one(path, "--against", args.against, "only bundle verify takes it")
    if args.action == "verify":
        return _verify_bundle(args, path, console)
    _print_lines(console, _bundle_lines(path, read_manifest(path), None))
    return 0


def _print_lines(console: Console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def _bundle_lines(path: Path, manifest: dict[str, Any], digest: str | None) -> list[str]:
    """What ``bundle inspect`` and ``verify`` print of a bundle: its target, I/O, members and
    lineage."""
    target = manifest.get("target", {})
    io = manifest.get("io", {})
    lineage = manifest.get("lineage", {})
    lines = [
        f"bundle {path}" + (f" sha256 {digest}" if digest else ""),
        f"task {manifest.get('task')}  target {target.get('name')} "
        f"(JetPack {target.get('jetpack')}, TensorRT {target.get('tensorrt')}, "
        f"{target.get('gpu_arch')})  precision {manifest.get('precision')}  "
        f"opset {manifest.get('opset')}",
        f"control {manifest.get('control_hz')} Hz, latency budget "
        f"{manifest.get('latency_budget_ms')} ms",
    ]
    for name in ("obs", "actions"):
        spec = io.get(name, {})
        lines.append(f"{name}: {spec.get('shape')} {', '.join(spec.get('names', []))}")
    if isinstance(io.get("chunk"), dict):
        how = ", ".join(f"{k} {v}" for k, v in io["chunk"].items() if k != "size")
        lines.append(f"chunk: {io['chunk'].get('size')} actions a query, run by {how}")
    if isinstance(io.get("diffusion"), dict):
        sampling = io["diffusion"]
        lines.append(f"diffusion: {sampling.get('n_obs_steps')} observations a query, "
                     f"{sampling.get('steps')} denoising steps of a "
                     f"{sampling.get('scheduler', {}).get('type')} scheduler, noise "
                     f"{sampling.get('noise', {}).get('generator')} seed "
                     f"{sampling.get('noise', {}).get('seed')}")
    lines += [f"file {n}: {f['bytes']} bytes sha256 {f['sha256']}"
              for n, f in sorted(manifest.get("files", {}).items())]
    return lines + [f"lineage {k}: {v}" for k, v in sorted(lineage.items())]


def _verify_bundle(args: argparse.Namespace, path: Path, console: Console) -> int:
    """``bundle verify``: every digest, the manifest, target, model and Dockerfile; the code
    members byte for byte against what this version packs for that manifest; the signature,
    with ``--trust`` or else the project's own public key. Code that differs, or a signature
    no key checked, is refused (exit 2) unless ``--allow-unsigned``, which prints what differs
    and warns in one line."""
    from edge.bundle import member_differences, open_bundle
    from edge.errors import BundleError
    from edge.manifest import check_bundle
    from edge.pack import packed_members
    from stages.steps.bundles import default_trust_key

    contents = open_bundle(path)  # read once; the signature is checked on these same bytes
    manifest = check_bundle(contents)
    if args.against:
        _same_as_registered(path, contents.sha256, args.against)
    packed = packed_members(manifest)
    differences = member_differences(contents, packed)
    if differences and not args.allow_unsigned:
        first, *others = differences
        more = (f"; member{'s' * (len(others) > 1)} {', '.join(map(repr, others))} "
                f"differ{'s' * (len(others) == 1)} too" if others else "")
        raise BundleError(f"{path}: {differences[first]}{more}: not the code this version "
                          "packs, signed or not; --allow-unsigned verifies it anyway and prints "
                          "what differs")
    trust = Path(args.trust) if args.trust else None
    if trust is None and not args.allow_unsigned:
        trust = default_trust_key()
        if trust is None:
            raise BundleError(f"{path}: signature NOT checked: no --trust KEY and no project "
                              "key (PHYSAI_HOME/keys/bundle-signing.pub), so nothing vouches "
                              "for its code and model; give --trust KEY.pub, or "
                              "--allow-unsigned to verify it unauthenticated")
    if trust is not None:
        _check_signature(contents, trust)
    code = [n for n in packed if packed[n] is not None and n in contents.members]
    lines = [
        *_bundle_lines(path, manifest, contents.sha256),
        f"verified: {len(manifest.get('files', {}))} files match the manifest; manifest, "
        "target, model and Dockerfile are consistent",
        *([f"code: {d}" for d in differences.values()] or [
            f"code: {', '.join(code)}: byte for byte what this version packs for this manifest"
            if code else "code: none (no engine.py, runtime.py or Dockerfile)"]),
        f"signature: made with the key of {trust} over exactly this content" if trust else
        f"signature: NOT checked (--allow-unsigned, no --trust KEY): the code members "
        f"({', '.join(code) or 'none'}) and the model are not authenticated; anyone could "
        "have written them",
    ]
    if args.against:
        lines.append(f"registered: this file is the bundle of {args.against}")
    _print_lines(console, lines)
    if trust is None or differences:
        what = (["its signature NOT checked"] if trust is None else []) + (
            [f"{len(differences)} member(s) not what this version packs"] if differences else [])
        print(f"warning: {path}: verified under --allow-unsigned with {' and '.join(what)}",
              file=sys.stderr, flush=True)
    return 0


def _check_signature(contents: BundleBytes, trust: Path) -> None:
    """Refuse ``contents`` (a read bundle) unless ``trust`` verifies its signature."""
    from edge.errors import BundleError
    from edge.runtime import RuntimeRefusal, check_signature
    from physai_core.errors import printable

    try:
        check_signature(contents, trust)
    except RuntimeRefusal as exc:
        raise BundleError(printable(str(exc))) from None


def trust_key(args: argparse.Namespace) -> Path | None:
    """The key a command that runs a bundle trusts: ``--trust``, else the project's own public
    key (none without one: then only ``--allow-unsigned`` runs a bundle); none under
    ``--allow-unsigned``, which asks to run what no key vouches for."""
    from physai_core.errors import ConfigError
    from stages.steps.bundles import default_trust_key

    if args.allow_unsigned:
        if args.trust:
            raise ConfigError.one(Path(args.file), "--trust", args.trust,
                                  "give --trust KEY or --allow-unsigned, not both")
        return None
    return Path(args.trust) if args.trust else default_trust_key()


def _registered_bundle_digest(uri: str) -> str:
    """The bundle digest a model version (``models:/NAME@ALIAS`` or ``/VERSION``) records."""
    from physai_core.errors import ConfigError
    from stages.orchestration.context import open_services

    _, _, lineage = open_services()
    version = lineage.resolve_model(uri)
    digest = version.tags.get("physai.bundle.digest")
    if not digest:
        raise ConfigError.one(uri, "physai.bundle.digest", None,
                              "the model version records no bundle")
    return digest


def _same_as_registered(path: Path, got: str, uri: str) -> None:
    from edge.errors import BundleError

    want = _registered_bundle_digest(uri)
    if got != want:
        raise BundleError(f"{path}: sha256 {got} is not the bundle of {uri} ({want})")


def _pull_bundle(args: argparse.Namespace, console: Console) -> int:
    """Copy a registered or stored bundle to ``-o FILE``, verified (and its signature checked
    with ``--trust``) before the file appears."""
    from physai_core.errors import ConfigError
    from stages.steps.bundles import pull_bundle

    if not args.out:
        raise ConfigError.one(args.file, "-o", None, "bundle pull needs an output file")
    pulled = pull_bundle(args.file, Path(args.out),
                         trust_key=Path(args.trust) if args.trust else None)
    console.print(f"wrote {args.out}: bundle {pulled.digest} from {pulled.source}, verified"
                  + (f", signed by the key of {args.trust}" if args.trust else ""),
                  soft_wrap=True, highlight=False, markup=False)
    return 0


def _drive_bundle(args: argparse.Namespace, path: Path, console: Console) -> int:
    """Drive a MuJoCo robot with the bundle through the edge runtime; print the success rate.
    A policy that sees reads the frames the task's cameras render each step. The bundle runs
    only when ``--trust`` (default: the project's public key) signed it, or with
    ``--allow-unsigned``."""
    from physai_core.errors import ConfigError
    from stages.evaluation.robot import drive_bundle
    from stages.sim.suites.loading import load_scene

    if args.scene is None:
        raise ConfigError.one(path, "--scene", None, "bundle drive needs a scene file")
    if args.episodes < 1:
        raise ConfigError.one(path, "--episodes", args.episodes, "must be at least 1")
    from edge.errors import BundleError
    from edge.runtime import RuntimeRefusal

    scene = load_scene(args.scene)
    try:
        result = drive_bundle(path, scene, args.episodes, rate_hz=args.rate, seed=args.seed,
                              engine=Path(args.engine) if args.engine else None,
                              trust_key=trust_key(args), allow_unsigned=args.allow_unsigned)
    except RuntimeRefusal as exc:  # the runtime's own error, standalone on the robot
        raise BundleError(str(exc)) from exc
    console.print(
        f"{result.scene}: {result.successes}/{result.episodes} = {result.success_rate:.3f} "
        f"[{result.ci_low:.3f}, {result.ci_high:.3f}] through the edge runtime "
        f"({result.provider}); loop {result.rate_hz:g} Hz, {result.steps} steps, "
        f"{result.deadline_misses} deadline misses, {result.safe_holds} safe holds, "
        f"inference p50 {result.latency_p50_us:.0f} us p99 {result.latency_p99_us:.0f} us"
        + _chunk_words(result.chunk, result.queries),
        soft_wrap=True, highlight=False, markup=False)
    return 0


def _chunk_words(chunk: dict[str, object] | None, queries: int) -> str:
    """How a drive ran a policy's chunks of actions, e.g. ``; chunks of 8 (ensemble 0.01),
    400 queries``; nothing for a policy of one action a query."""
    if chunk is None:
        return ""
    how = ", ".join(f"{k} {v}" for k, v in chunk.items() if k != "size")
    return f"; chunks of {chunk['size']} ({how}), {queries} queries"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bundle verify|inspect|pull|drive`` to the ``flows`` parser."""
    bundle = sub.add_parser("bundle", help="verify, inspect, pull or drive an edge bundle")
    bundle.add_argument("action", choices=("verify", "inspect", "pull", "drive"),
                        help="verify: every digest, the manifest schema, target, model and "
                             "Dockerfile, the code members against this version's and the "
                             "signature (exit 2 unless all hold, or --allow-unsigned); pull: "
                             "copy a registered or stored bundle to -o FILE, verified; drive: run "
                             "it on a MuJoCo robot through the runtime, rendering the cameras "
                             "its policy reads")
    bundle.add_argument("file", help="bundle tar file; pull: models:/NAME@ALIAS, "
                                     "models:/NAME/VERSION or a bundle digest")
    bundle.add_argument("--trust", help="verify, pull, drive: PEM public key; the bundle must "
                                        "be signed with its private key over exactly its "
                                        "content (verify, drive: default the project's own, "
                                        "PHYSAI_HOME/keys/bundle-signing.pub)")
    bundle.add_argument("--allow-unsigned", action="store_true",
                        help="drive: run a bundle no trusted key signed (a warning each time); "
                             "verify: exit 0 on a bundle whose signature no key checked or "
                             "whose code members (engine.py, runtime.py, Dockerfile) are not "
                             "what this version packs, printing what differs (with --trust "
                             "the signature must still verify)")
    bundle.add_argument("--against", help="verify: models:/NAME@ALIAS; the file must be that "
                                          "version's bundle")
    bundle.add_argument("-o", "--out", help="pull: the file to write")
    bundle.add_argument("--scene", help="drive: scene file of the bundle's task")
    bundle.add_argument("--episodes", type=int, default=50, help="drive: episodes to run")
    bundle.add_argument("--rate", type=float, default=None,
                        help="drive: control-loop rate, Hz (default: the bundle's)")
    bundle.add_argument("--seed", type=int, default=0, help="drive: scene randomization seed")
    bundle.add_argument("--engine", help="drive: a TensorRT engine built from the bundle "
                                         "(flows engine build), beside its engine_report.json; "
                                         "run it instead of ONNX Runtime")
    bundle.set_defaults(func=cmd_bundle)
