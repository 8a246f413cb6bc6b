"""What the LeRobot trainer stage reads of LeRobot's run: its metrics lines (a rounded step,
so the step is counted), its checkpoint folders as artifacts and back (only regular files, the
same bytes for the same files), and its restored config pointed at the new attempt's folders."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from physai_core.errors import PhysaiError
from stages.training.lerobot_run import (
    checkpoint_tar,
    logged_step,
    parse_loss,
    repoint_config,
    restore_checkpoint,
    train_config,
)

# As LeRobot 0.6.1 printed it in this project's pick-place run (lerobot_train.py:641).
LINE = ("INFO 2026-12-06 10:18:41 ot_train.py:641 step:1K smpl:16K ep:91 epch:0.46 loss:0.414 "
        "grdn:3.142 lr:1.0e-04 updt_s:0.233 data_s:0.010")


def test_the_loss_of_a_metrics_line_and_nothing_else() -> None:
    assert parse_loss(LINE) == pytest.approx(0.414)
    assert parse_loss("INFO Checkpoint policy after step 1000") is None
    assert parse_loss("Training:  17%|#7        | 1000/6000 [04:10<20:50,  4.00step/s]") is None


def test_the_step_of_each_metrics_line_is_counted_from_the_start() -> None:
    assert [logged_step(0, 100, k) for k in (1, 2, 11, 12)] == [100, 200, 1100, 1200]
    # Resumed from a checkpoint of step 250: LeRobot next logs at 300.
    assert [logged_step(250, 100, k) for k in (1, 2)] == [300, 400]
    assert logged_step(1000, 100, 1) == 1100


def checkpoint(folder: Path, weights: bytes = b"w" * 1000) -> Path:
    (folder / "pretrained_model").mkdir(parents=True)
    (folder / "training_state").mkdir()
    (folder / "pretrained_model" / "model.safetensors").write_bytes(weights)
    (folder / "pretrained_model" / "train_config.json").write_text(json.dumps(
        {"output_dir": "/elsewhere/train", "dataset": {"root": "/elsewhere/dataset"}}))
    (folder / "training_state" / "training_step.json").write_text('{"step": 250}')
    return folder


def test_a_checkpoint_round_trips_with_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    first = checkpoint(tmp_path / "a" / "000250")
    second = checkpoint(tmp_path / "b" / "000250")
    checkpoint_tar(first, tmp_path / "a.tar")
    checkpoint_tar(second, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    restore_checkpoint(tmp_path / "a.tar", tmp_path / "restored")
    assert (tmp_path / "restored" / "pretrained_model" / "model.safetensors").read_bytes() \
        == b"w" * 1000
    config = tmp_path / "restored" / "pretrained_model" / "train_config.json"
    repoint_config(config, tmp_path / "train", tmp_path / "dataset")
    data = json.loads(config.read_text())
    assert data["output_dir"] == str(tmp_path / "train")
    assert data["dataset"]["root"] == str(tmp_path / "dataset")


@pytest.mark.parametrize("member", ["link", "../outside"])
def test_a_checkpoint_with_a_link_or_a_path_outside_is_refused(tmp_path: Path,
                                                                member: str) -> None:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(PhysaiError):
        restore_checkpoint(path, tmp_path / "restored")
    assert not (tmp_path / "outside").exists()


def test_lerobots_config_names_the_policy_the_dataset_and_no_hub(tmp_path: Path) -> None:
    config = train_config(policy="act", options={"dim_model": 64}, dataset_root=tmp_path / "d",
                          repo_id="physai/pick-place-vision-v0", output_dir=tmp_path / "o",
                          device="cpu", seed=3, steps=100, batch_size=8, save_freq=50,
                          log_freq=10, num_workers=0)
    assert config["policy"] == {"type": "act", "dim_model": 64, "device": "cpu",
                                "push_to_hub": False}
    assert config["dataset"]["root"] == str(tmp_path / "d")
    assert config["wandb"] == {"enable": False} and config["env_eval_freq"] == 0
    assert (config["steps"], config["save_freq"], config["seed"]) == (100, 50, 3)
