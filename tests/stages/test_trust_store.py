"""A local store's renames are on disk before it goes on: after each file is renamed into
place its folder is synced, and every folder it makes is synced into the one above, so the
payload-before-manifest order survives a power cut and not only a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stages.artifacts.records import Dataset
from stages.storage.store import LocalStore


def test_each_rename_and_each_new_folder_is_synced_before_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, Path]] = []
    real_fsync, real_replace, real_mkdir = os.fsync, os.replace, Path.mkdir

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        events.append(("rename", Path(dst)))

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        existed = self.is_dir()
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]
        if not existed:
            events.append(("mkdir", self))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    payload = tmp_path / "demos.npz"
    payload.write_bytes(b"episodes" * 100)
    store = LocalStore(tmp_path / "store")
    artifact = store.publish(payload, lambda digest, uri: Dataset.model_construct(
        task="reach-v0", digest=digest, uri=uri, episodes=1, transitions=8))
    store.set_ref("reach/latest", artifact.digest)

    renames = [i for i, (kind, _) in enumerate(events) if kind == "rename"]
    assert [events[i][1] for i in renames] == [
        store.path / "objects" / artifact.digest[:2] / artifact.digest,
        store.path / "artifacts" / f"{artifact.digest}.json",
        store.path / "refs" / "reach" / "latest"]
    for i, end in zip(renames, [*renames[1:], len(events)], strict=True):
        folder = events[i][1].parent
        assert ("fsync", folder) in events[i + 1:end], f"{folder} not synced after its rename"
    made = [(i, path) for i, (kind, path) in enumerate(events) if kind == "mkdir"]
    assert {path for _, path in made} >= {store.path, store.path / "objects",
                                          store.path / "refs" / "reach"}
    for i, path in made:
        later_writes = [j for j, (kind, _) in enumerate(events) if kind == "rename" and j > i]
        synced = [j for j, event in enumerate(events) if event == ("fsync", path.parent)]
        assert any(i < j < later_writes[0] for j in synced), f"{path} not synced into its parent"
