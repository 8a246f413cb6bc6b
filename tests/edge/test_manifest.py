"""The packed bundle: schema, members, full check, and bundles that pass the digests but lie."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge.bundle import read_manifest, unpack_bundle, verify_bundle, write_bundle
from edge.errors import BundleError
from edge.manifest import check_bundle, schema, validate_manifest
from edge.pack import pack_policy_bundle
from edge.targets import get_target

MEMBERS = ["Dockerfile", "calibration/obs.npy", "engine.py", "policy.onnx", "runtime.py"]


def test_schema_is_a_valid_json_schema() -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema())


def test_packed_bundle_holds_everything_and_checks(policy_bundle: Path) -> None:
    manifest = check_bundle(policy_bundle)
    assert sorted(manifest["files"]) == MEMBERS
    assert manifest["engine"]["calibration"]["samples"] == 256
    assert manifest["engine"]["tolerances"]["int8"] > manifest["engine"]["tolerances"]["fp16"]
    with tarfile.open(policy_bundle) as tar:
        scripts = {n: tar.extractfile(n).read() for n in ("engine.py", "runtime.py")}  # type: ignore[union-attr]
    for name, data in scripts.items():
        assert data == (Path(__file__).parents[2] / "edge" / name).read_bytes()


def test_packing_is_byte_deterministic(
    policy_bundle: Path, onnx_path: Path, dataset_obs: Any, manifest_fields: dict[str, Any],
    tmp_path: Path,
) -> None:
    from edge.calibration import draw_calibration_set

    again = tmp_path / "again.tar"
    pack_policy_bundle(again, onnx_path, draw_calibration_set(dataset_obs, 256),
                       "dataset observations", manifest_fields, get_target("jetson-agx-orin"))
    assert again.read_bytes() == policy_bundle.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.tar"]


def test_schema_violation_is_refused_before_anything_is_written(
    onnx_path: Path, dataset_obs: Any, manifest_fields: dict[str, Any], tmp_path: Path
) -> None:
    bad = copy.deepcopy(manifest_fields)
    bad["io"]["obs"]["dtype"] = "float64"
    with pytest.raises(BundleError, match=r"field 'io\.obs\.dtype'.*\(value: \"float64\"\)"):
        pack_policy_bundle(tmp_path / "b.tar", onnx_path, dataset_obs, "x", bad,
                           get_target("jetson-agx-orin"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("control_hz", 0, "field 'control_hz'"),
        ("precision", "fp64", "field 'precision'"),
        ("lineage", {"policy_digest": "x"}, "field 'lineage'"),
        ("format_version", 2, "field 'format_version'"),
        ("extra", 1, "Additional properties are not allowed"),
    ],
)
def test_validate_manifest_names_the_field(
    policy_bundle: Path, field: str, value: object, fragment: str
) -> None:
    manifest = read_manifest(policy_bundle) | {field: value}
    with pytest.raises(BundleError) as caught:
        validate_manifest(manifest, policy_bundle)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def _rewrite(src: Path, dest: Path, manifest_edit: Callable[[dict[str, Any]], None],
             member_edit: Callable[[str, bytes], bytes] = lambda name, data: data) -> Path:
    """Re-pack ``src`` into ``dest`` with an edited manifest and members, digests recomputed:
    a bundle whose digests all match but whose content lies."""
    root = dest.parent / f"{dest.stem}-src"
    manifest = unpack_bundle(src, root)
    for name in manifest["files"]:
        path = root / name
        path.write_bytes(member_edit(name, path.read_bytes()))
    fields = {k: v for k, v in manifest.items() if k not in ("files", "format_version")}
    manifest_edit(fields)
    write_bundle(dest, {name: root / name for name in manifest["files"]}, fields)
    return dest


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(fields: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = fields
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _keep(fields: dict[str, Any]) -> None:
    pass


def _dockerfile(old: str, new: str) -> Callable[[str, bytes], bytes]:
    return lambda name, data: data.replace(old.encode(), new.encode()) if name == "Dockerfile" \
        else data


LYING: dict[str, tuple[Callable[[dict[str, Any]], None], Callable[[str, bytes], bytes], str]] = {
    "opset-past-target-parser": (_set("opset", 21), lambda n, d: d,
                                 "parses ONNX opsets 9-20 (value: 21)"),
    "opset-differs-from-model": (_set("opset", 18), lambda n, d: d,
                                 "model opset [17] differs from the manifest's field 'opset'"),
    "precision-target-lacks": (_set("precision", "fp8"), lambda n, d: d,
                               "supports precisions fp32, fp16, int8 (value: 'fp8')"),
    "target-row-tampered": (_set("target.tensorrt", "8.6"), lambda n, d: d,
                            "field 'target.tensorrt' disagrees with the compatibility matrix"),
    "unknown-target": (_set("target.name", "jetson-nano"), lambda n, d: d,
                       "unknown edge target 'jetson-nano'"),
    "io-width": (_set("io.obs.shape", ["batch", 12]), lambda n, d: d,
                 "obs width 11 differs from the manifest's field 'io.obs.shape'"),
    "schema": (_set("normalization.baked_into_model", False), lambda n, d: d,
               "field 'normalization.baked_into_model'"),
    "dockerfile-base": (_keep, _dockerfile("l4t-jetpack:r36.4.0", "l4t-jetpack:r35.4.1"),
                        "base image must be nvcr.io/nvidia/l4t-jetpack:r36.4.0"),
    "dockerfile-copy": (_keep, _dockerfile("COPY engine.py", "COPY secrets.txt engine.py"),
                        "COPY source 'secrets.txt' is not a file of the bundle"),
    "not-onnx": (_keep, lambda n, d: b"\x00garbage" if n == "policy.onnx" else d,
                 "member 'policy.onnx': not an ONNX model"),
}


@pytest.mark.parametrize("case", sorted(LYING))
def test_bundle_whose_digests_match_but_content_lies_is_refused(
    policy_bundle: Path, tmp_path: Path, case: str
) -> None:
    manifest_edit, member_edit, fragment = LYING[case]
    bad = _rewrite(policy_bundle, tmp_path / "lying.tar", manifest_edit, member_edit)
    verify_bundle(bad)  # every digest matches
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BundleError) as caught:
        check_bundle(bad)
    message = str(caught.value)
    assert message.startswith(str(bad)) and fragment in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_verify_refuses_a_lying_bundle_with_status_two(
    policy_bundle: Path, tmp_path: Path
) -> None:
    bad = _rewrite(policy_bundle, tmp_path / "lying.tar", _set("opset", 21))
    done = subprocess.run([sys.executable, "-m", "flows.cli", "bundle", "verify", str(bad)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert re.fullmatch(r"flows: error: .*lying\.tar: member 'manifest\.json': .*\(value: 21\)\n",
                        done.stderr), done.stderr
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "bundle", "verify",
                         str(policy_bundle), "--allow-unsigned"], capture_output=True, text=True,
                        cwd=tmp_path, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "verified: 5 files match the manifest" in ok.stdout
    assert json.loads(json.dumps(read_manifest(policy_bundle)))["opset"] == 17
