"""Security review, kept true: static rules over the project's code, and the behaviour behind
them on hostile inputs (YAML tags, pickles, path traversal, data outside a dataset's file).

Static rules, checked on the syntax tree of every Python file of ``stages``, ``flows``,
``edge`` and ``benchmarks``:

- YAML is read with ``yaml.safe_load`` only (no ``load``/``full_load``/``unsafe_load`` unless
  given ``SafeLoader``);
- every ``torch.load`` passes ``weights_only=True``; every ``np.load`` passes
  ``allow_pickle=False``; nothing calls ``pickle``, ``marshal``, ``shelve``, ``dill`` or
  ``joblib`` loaders;
- no tar or zip archive is extracted with ``extract``/``extractall``: bundles are streamed
  member by member through the checks of :mod:`edge.bundle` and :mod:`edge.runtime`;
- no ``eval``/``exec`` builtins, no ``shell=True``;
- every Prefect task or flow that persists or caches its result serializes it as JSON, so
  Prefect's result storage never holds a pickle to load back.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import tarfile
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import h5py
import numpy as np
import pytest
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("physai_core", "stages", "flows", "edge", "benchmarks")


@dataclass(frozen=True)
class Call:
    """One call in the project's code: where, the dotted callee and its keywords."""

    file: str
    line: int
    callee: str
    keywords: dict[str, ast.expr]

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.callee}"

    def constant(self, keyword: str) -> object:
        """The keyword's value when it is a literal, else a marker that it is missing."""
        node = self.keywords.get(keyword)
        return node.value if isinstance(node, ast.Constant) else "<missing or not a literal>"


def _callee(node: ast.expr) -> str:
    """``a.b.c`` for a dotted callee, ``<expr>.c`` when the base is not a plain name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_callee(node.value)}.{node.attr}"
    return "<expr>"


def _calls() -> list[Call]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    keywords = {k.arg: k.value for k in node.keywords if k.arg}
                    out.append(Call(str(path.relative_to(ROOT)), node.lineno,
                                    _callee(node.func), keywords))
    return out


CALLS = _calls()


def _named(*names: str) -> list[Call]:
    return [c for c in CALLS if c.callee in names or c.callee.endswith(tuple(f".{n}"
                                                                             for n in names))]


def test_the_scan_sees_the_code() -> None:
    assert len(CALLS) > 2000
    assert [str(c) for c in _named("yaml.safe_load")]
    assert [str(c) for c in _named("torch.load")]
    assert [str(c) for c in _named("np.load")]


def test_yaml_is_loaded_safely() -> None:
    safe = ("yaml.SafeLoader", "yaml.CSafeLoader")
    loads = _named("yaml.load", "yaml.load_all")
    unsafe = [c for c in loads if _callee(c.keywords.get("Loader", ast.Name("?"))) not in safe]
    unsafe += _named("yaml.full_load", "yaml.full_load_all", "yaml.unsafe_load",
                     "yaml.unsafe_load_all")
    assert [str(c) for c in unsafe] == []


def test_torch_load_takes_weights_only() -> None:
    assert [str(c) for c in _named("torch.load") if c.constant("weights_only") is not True] == []


def test_numpy_load_refuses_pickles() -> None:
    loads = _named("np.load", "numpy.load")
    assert [str(c) for c in loads if c.constant("allow_pickle") is not False] == []


def test_nothing_unpickles() -> None:
    loaders = ("pickle.load", "pickle.loads", "pickle.Unpickler", "marshal.load",
               "marshal.loads", "shelve.open", "dill.load", "dill.loads", "joblib.load",
               "cloudpickle.load", "cloudpickle.loads")
    assert [str(c) for c in CALLS if c.callee in loaders] == []


def test_no_archive_is_extracted_blindly() -> None:
    extracting = [str(c) for c in CALLS
                  if c.callee.endswith((".extractall", ".extract", "shutil.unpack_archive"))]
    assert extracting == []


def test_no_eval_exec_or_shell() -> None:
    assert [str(c) for c in CALLS if c.callee in ("eval", "exec")] == []
    assert [str(c) for c in CALLS if c.constant("shell") is True] == []


def test_persisted_prefect_results_are_json() -> None:
    persisted = [c for c in CALLS if c.callee in ("task", "flow", "prefect.task", "prefect.flow")
                 and {"persist_result", "cache_key_fn", "cache_policy"} & set(c.keywords)]
    assert persisted
    assert [str(c) for c in persisted if c.constant("result_serializer") != "json"] == []


# ------------------------------------------------------------------- behaviour on hostile input


def test_yaml_tags_never_run_code(tmp_path: Path) -> None:
    from physai_core.errors import ConfigError
    from stages.core.loading import read_yaml

    marker = tmp_path / "ran"
    hostile = tmp_path / "pipeline.yaml"
    hostile.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(hostile)
    assert str(hostile) in str(caught.value) and not marker.exists()


def test_a_yaml_alias_bomb_is_rejected_at_once(tmp_path: Path) -> None:
    import time

    from physai_core.errors import ConfigError
    from stages.pipeline.config import load_pipeline

    levels = "abcdefghi"
    lines = ["name: bomb", f"a: &a [{', '.join(['lol'] * 9)}]"]
    lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in pairwise(levels)]
    bomb = tmp_path / "pipeline.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        load_pipeline(bomb)
    assert time.perf_counter() - start < 10
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 4000


class _Payload:
    """Unpickling this would create the file ``target``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.target), "w"))


def test_a_policy_file_holding_a_pickle_is_refused_unrun(tmp_path: Path) -> None:
    from physai_core.errors import ConfigError
    from stages.policies.local import load_policy

    marker = tmp_path / "ran"
    path = tmp_path / "policy.npz"
    np.savez(path, obs_mean=np.array([_Payload(marker)], dtype=object))
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert "policy.npz" in str(caught.value) and not marker.exists()


def test_a_checkpoint_holding_a_pickle_is_refused_unrun(tmp_path: Path) -> None:
    import torch

    marker = tmp_path / "ran"
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(pickle.dumps({"model": _Payload(marker)}, protocol=2))
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert not marker.exists()


def test_a_scene_name_cannot_name_a_path(tmp_path: Path) -> None:
    from physai_core.errors import ConfigError
    from stages.sim.suites.loading import load_scene

    for name in ("../../escape", "a/b", "..", ".hidden", "name with space"):
        scene = tmp_path / "scene.yaml"
        scene.write_text(json.dumps({
            "name": name, "task": "reach-v0", "episode_steps": 10,
            "randomization": {"target_low": [0.4, -0.1, 0.2], "target_high": [0.5, 0.1, 0.3]}}))
        with pytest.raises(ConfigError) as caught:
            load_scene(scene)
        assert [p.field for p in caught.value.problems] == ["name"], name


def test_an_artifact_digest_cannot_name_a_path(tmp_path: Path) -> None:
    from physai_core.errors import IntegrityError
    from stages.artifacts.records import Policy, Producer
    from stages.storage.store import LocalStore

    fields = {"uri": "file:///x", "parents": (), "task": "reach-v0", "obs_dim": 1,
              "act_dim": 1, "hidden": (1,),
              "producer": Producer(stage="train", stage_version="1", config_digest="c",
                                   code_revision="r")}
    for digest in ("../../../etc/passwd", "A" * 64, "0" * 63):
        with pytest.raises(ValidationError):
            Policy(digest=digest, **fields)
    store = LocalStore(tmp_path / "store")
    good = "0" * 64
    manifest = tmp_path / "store" / "artifacts" / f"{good}.json"
    manifest.parent.mkdir(parents=True)
    lying = Policy(digest=good, **fields).model_dump(mode="json")
    manifest.write_text(json.dumps({**lying, "digest": "../../../../etc/passwd"}))
    with pytest.raises(IntegrityError):
        store.get(good)


def test_a_dataset_never_reads_outside_its_file(tmp_path: Path) -> None:
    from physai_core.errors import ConfigError
    from stages.datasets.demonstrations import read_transitions

    secret = tmp_path / "outside.bin"
    secret.write_bytes(np.ones((3, 2), "f4").tobytes())
    other = tmp_path / "other.hdf5"
    with h5py.File(other, "w") as f:
        f["x"] = np.ones((3, 2), "f4")
    makers = {
        "external link": lambda f: f.__setitem__("data/demo_0/actions",
                                                 h5py.ExternalLink(str(other), "x")),
        "external storage": lambda f: f.create_dataset(
            "data/demo_0/actions", (3, 2), "f4", external=[(str(secret), 0, 24)]),
    }
    for name, make in makers.items():
        path = tmp_path / f"{name}.hdf5"
        with h5py.File(path, "w") as f:
            f["data/demo_0/obs/policy"] = np.zeros((3, 4), "f4")
            make(f)
        with pytest.raises(ConfigError) as caught:
            read_transitions(path, 4, 2)
        assert str(path) in str(caught.value), name


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
            link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def test_bundles_never_write_outside_their_folder(tmp_path: Path) -> None:
    from edge.bundle import unpack_bundle
    from edge.errors import BundleError
    from edge.runtime import RuntimeRefusal, load_bundle

    escape = tmp_path / "escaped"
    cases = {
        "dot-dot": [_member("../escaped", b"x")],
        "absolute": [_member(str(escape), b"x")],
        "symlink": [_member("link", kind=tarfile.SYMTYPE, link=str(escape)),
                    _member("link", b"x")],
        "hard link": [_member("link", kind=tarfile.LNKTYPE, link="../escaped")],
    }
    for case, members in cases.items():
        listed = {i.name: {"bytes": i.size, "sha256": "0" * 64} for i, _ in members}
        manifest = json.dumps({"files": listed, "format_version": 1}).encode()
        bundle = tmp_path / f"{case}.tar"
        bundle.write_bytes(_tar([_member("manifest.json", manifest), *members]))
        with pytest.raises(BundleError):
            unpack_bundle(bundle, tmp_path / f"{case}-unpacked")
        with pytest.raises(RuntimeRefusal):
            load_bundle(bundle, tmp_path / f"{case}-run")
        assert not escape.exists() and not (tmp_path / f"{case}-unpacked").exists(), case
        assert list((tmp_path / f"{case}-run").iterdir()) == [], case


def test_the_runtime_reads_the_format_the_packer_writes() -> None:
    from edge import bundle, runtime

    assert (runtime.FORMAT_VERSION, runtime.MANIFEST_NAME) == (bundle.FORMAT_VERSION,
                                                               bundle.MANIFEST_NAME)
