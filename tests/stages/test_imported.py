"""Policies trained elsewhere: ONNX and TorchScript files in, checked, mapped and run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.policies.local import build_policy, load_actor, policy_fn, save_policy
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.training.import_checks import probe_observations
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, ImportedPolicy, import_policy
from tests.fixtures.imported.policies import PD_GAINS, pd_actions, pd_onnx, pd_torchscript

TASK = "gymnasium:InvertedPendulum-v5"
WHERE = Where("pipeline.yaml", "train.source")


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return get_task(TASK)


def bring(tmp_path: Path, spec: TaskSpec, **fields: object) -> tuple[np.ndarray, ImportedPolicy]:
    """Import, store the result as a file and run it on the probe observations."""
    imported = import_policy(ImportConfig(**fields), spec, base=tmp_path, where=WHERE)
    path = tmp_path / "stored.onnx"
    path.write_bytes(imported.onnx)
    obs = probe_observations(spec.obs_dim, seed=3)
    return load_actor(path)(obs), imported


def test_onnx_in_the_convention_is_stored_as_given(tmp_path: Path, spec: TaskSpec) -> None:
    source = pd_onnx(tmp_path / "policy.onnx", batch=1)  # Isaac Lab exports batch 1
    actions, imported = bring(tmp_path, spec, source="policy.onnx")
    assert imported.as_given
    assert imported.onnx == source.read_bytes()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert imported.source_digest == digest
    np.testing.assert_allclose(actions, pd_actions(probe_observations(4, seed=3)), atol=1e-6)


def test_other_names_and_order_are_mapped_without_touching_the_network(
    tmp_path: Path, spec: TaskSpec
) -> None:
    # The policy reads the observation reversed, under another tensor name.
    pd_onnx(tmp_path / "p.onnx", tuple(reversed(PD_GAINS)), input_name="policy",
            output_name="mu")
    actions, imported = bring(tmp_path, spec, source="p.onnx",
                              inputs={"policy": ["obs[3]", "obs[2]", 1, 0]},
                              outputs={"mu": ["act[0]"]})
    assert not imported.as_given
    assert imported.parity_max_abs_diff == 0.0
    np.testing.assert_allclose(actions, pd_actions(probe_observations(4, seed=3)), atol=1e-6)
    # Without the mapping the reversed policy would act differently: the oracle can fail.
    unmapped, _ = bring(tmp_path, spec, source="p.onnx")
    assert not np.allclose(unmapped, actions, atol=1e-3)


def test_a_policy_of_fewer_observations_reads_the_mapped_subset(
    tmp_path: Path, spec: TaskSpec
) -> None:
    pd_onnx(tmp_path / "p.onnx", PD_GAINS[1:])  # no cart position
    actions, _ = bring(tmp_path, spec, source="p.onnx", inputs={"obs": ["obs[1]", 2, 3]})
    expected = pd_actions(probe_observations(4, seed=3), (0.0, *PD_GAINS[1:]))
    np.testing.assert_allclose(actions, expected, atol=1e-6)


def test_torchscript_is_refused_without_trust_code_and_exported_with_it(
    tmp_path: Path, spec: TaskSpec
) -> None:
    pd_torchscript(tmp_path / "policy.pt")
    with pytest.raises(ConfigError) as refused:
        bring(tmp_path, spec, source="policy.pt")
    message = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in message
    assert "train.trust_code" in message and "code that runs" in message
    actions, imported = bring(tmp_path, spec, source="policy.pt", trust_code=True)
    assert imported.source_kind == "torchscript"
    assert imported.parity_max_abs_diff < 1e-5
    np.testing.assert_allclose(actions, pd_actions(probe_observations(4, seed=3)), atol=1e-6)


def write_pickle(path: Path) -> Path:
    import torch

    torch.save({"w": torch.zeros(2)}, path)
    return path


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.write_text("not a network\n") and p, "not an ONNX model"),
    (lambda p: pd_onnx(p, (*PD_GAINS, 1.0)), "wrong input width: input 'obs' has 5 entries"),
    (lambda p: pd_onnx(p, scale=float("nan")), "NaN or infinite actions for 65 of 65"),
    (write_pickle, "pickled torch file"),
], ids=["not-onnx", "wrong-width", "nan-output", "pickle"])
def test_a_bad_policy_file_is_one_line_naming_file_and_field(
    tmp_path: Path, spec: TaskSpec, make: object, says: str
) -> None:
    make(tmp_path / "bad.onnx")  # type: ignore[operator]
    with pytest.raises(ConfigError) as exc:
        import_policy(ImportConfig(source="bad.onnx"), spec, base=tmp_path, where=WHERE)
    message = str(exc.value)
    assert exc.value.exit_code == 2 and "\n" not in message
    assert message.startswith("pipeline.yaml: train.source: ") and says in message


@pytest.mark.parametrize(("fields", "says"), [
    ({"inputs": {"obs": ["obs[9]"]}}, "no observation entry of that name"),
    ({"inputs": {"state": [0, 1, 2, 3]}}, "no input of that name"),
    ({"outputs": {"actions": [0, 0]}}, "wrong output width"),
    ({"sha256": "0" * 64}, "train.sha256"),
], ids=["unknown-entry", "unknown-tensor", "output-width", "pinned-digest"])
def test_a_bad_mapping_or_pin_is_refused(
    tmp_path: Path, spec: TaskSpec, fields: dict[str, object], says: str
) -> None:
    pd_onnx(tmp_path / "p.onnx")
    with pytest.raises(ConfigError, match=says):
        import_policy(ImportConfig(source="p.onnx", **fields), spec, base=tmp_path,
                      where=WHERE)


def test_load_actor_runs_an_npz_mlp_and_an_onnx_policy_alike(tmp_path: Path) -> None:
    module = build_policy(4, 1, (8,), np.zeros(4), np.ones(4))
    save_policy(module, tmp_path / "p.npz", {"obs_dim": 4, "act_dim": 1, "hidden": [8]})
    obs = probe_observations(4)
    np.testing.assert_array_equal(load_actor(tmp_path / "p.npz")(obs), policy_fn(module)(obs))
    batch_one = load_actor(pd_onnx(tmp_path / "p.onnx", batch=1))(obs)
    assert batch_one.shape == (len(obs), 1)
    np.testing.assert_allclose(batch_one, pd_actions(obs), atol=1e-6)


def import_config(source: str) -> dict[str, object]:
    """A pipeline config that imports ``source`` and validates it on the fixture suite."""
    suite = Path(__file__).resolve().parents[1] / "fixtures" / "imported" / "suite.yaml"
    return {"name": "imported", "task": TASK, "train": {"source": source},
            "validate": {"suite": str(suite), "min_success": 0.5},
            "promote": {"model_name": "imported"}}


def test_flows_check_names_the_import_algorithm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from flows.cli import main

    config = import_config("policy.onnx")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    pd_onnx(tmp_path / "policy.onnx")
    assert main(["check", str(tmp_path / "pipeline.yaml")]) == 0
    assert "stage: train (import) on dgx" in capsys.readouterr().out
    config["train"] = {"source": "policy.onnx", "trust_code": "maybe"}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    assert main(["check", str(tmp_path / "pipeline.yaml")]) == 2
    assert "train.trust_code" in capsys.readouterr().err


def test_the_train_cache_key_follows_the_source_bytes(tmp_path: Path) -> None:
    import yaml

    from stages.pipeline.config import load_pipeline
    from stages.pipeline.run import stage_key

    config = import_config("policy.onnx")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    pd_onnx(tmp_path / "policy.onnx")
    first = stage_key("train", load_pipeline(path), ())
    assert stage_key("train", load_pipeline(path), ()) == first
    pd_onnx(tmp_path / "policy.onnx", scale=0.5)
    assert stage_key("train", load_pipeline(path), ()) != first


def test_a_missing_source_file_is_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from flows.cli import main

    config = import_config("missing.onnx")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    assert main(["check", str(tmp_path / "pipeline.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.source: policy file not found" in err and "\n" not in err, err
