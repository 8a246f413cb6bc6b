"""``module:attribute`` references, as every registry names code: what resolves, and the one
line that says what failed when one does not."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from physai_core.errors import PhysaiError
from physai_core.plugins import RefError, resolve_ref


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` to write throwaway modules into."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("refprobe_")]:
        del sys.modules[name]


def test_a_reference_resolves_to_its_attribute_dotted_too() -> None:
    assert resolve_ref("physai_core.plugins:resolve_ref", what="probe") is resolve_ref
    assert resolve_ref("physai_core.plugins:RefError.__name__", what="probe") == "RefError"


@pytest.mark.parametrize("ref", ["physai_core.plugins", "physai_core.plugins:", ":resolve_ref",
                                 " : "])
def test_a_malformed_reference_says_the_form(ref: str) -> None:
    with pytest.raises(RefError) as caught:
        resolve_ref(ref, what="stage 'train' runner")
    assert str(caught.value) == f"stage 'train' runner {ref!r}: expected 'module:attribute'"


def test_a_missing_module_names_the_reference_and_the_import_error() -> None:
    with pytest.raises(RefError) as caught:
        resolve_ref("no_such_module_xyz.sub:train", what="algorithm 'wide' trainer")
    message = str(caught.value)
    assert message == ("algorithm 'wide' trainer 'no_such_module_xyz.sub:train': importing module "
                       "'no_such_module_xyz.sub' failed: ModuleNotFoundError: No module named "
                       "'no_such_module_xyz'")
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, PhysaiError)
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_a_missing_attribute_names_the_module_and_the_attribute(modules: Path) -> None:
    (modules / "refprobe_attr.py").write_text("def train():\n    pass\n")
    with pytest.raises(RefError) as caught:
        resolve_ref("refprobe_attr:trian", what="task registration")
    assert str(caught.value) == ("task registration 'refprobe_attr:trian': module "
                                 "'refprobe_attr' has no attribute 'trian'")
    assert caught.value.__cause__ is None


def test_a_module_that_fails_while_importing_is_one_line(modules: Path) -> None:
    (modules / "refprobe_broken.py").write_text("raise RuntimeError('arm.xml:\\n not found')\n")
    with pytest.raises(RefError) as caught:
        resolve_ref("refprobe_broken:make", what="simulator backend 'newton' factory")
    assert str(caught.value) == (
        "simulator backend 'newton' factory 'refprobe_broken:make': importing module "
        "'refprobe_broken' failed: RuntimeError: arm.xml: not found")


def test_our_own_error_raised_while_importing_passes_through(modules: Path) -> None:
    (modules / "refprobe_extra.py").write_text(
        "from physai_core.errors import PhysaiError\nraise PhysaiError('install the extra')\n")
    with pytest.raises(PhysaiError) as caught:
        resolve_ref("refprobe_extra:make", what="probe")
    assert type(caught.value) is PhysaiError and str(caught.value) == "install the extra"


def test_registries_name_their_references_in_the_error() -> None:
    import dataclasses

    from stages.orchestration.stage_table import stage_def
    from stages.training.algorithms import get_algorithm

    stage = dataclasses.replace(stage_def("train"), runner_ref="stages.steps.train:no_such_runner")
    with pytest.raises(RefError, match=r"^stage 'train' runner "
                       r"'stages.steps.train:no_such_runner': "
                                       r"module 'stages.steps.train' has no attribute"):
        stage.run(None, None)  # type: ignore[arg-type]
    bc = dataclasses.replace(get_algorithm("bc"), version_ref="stages.nowhere:VERSION")
    with pytest.raises(RefError, match=r"^algorithm 'bc' version 'stages.nowhere:VERSION': "
                                       r"importing module 'stages.nowhere' failed"):
        _ = bc.version


def test_a_dataset_format_whose_library_is_missing_names_its_extra(tmp_path: Path) -> None:
    from physai_core.errors import BackendUnavailableError
    from stages.datasets.formats import DatasetFormat

    fmt = DatasetFormat("probe", "a probe", "no_such_lib_xyz:read", "no_such_lib_xyz:write",
                        extra="probe")
    with pytest.raises(BackendUnavailableError, match=r"^backend 'dataset format probe' is not "
                       r"installed \(No module named 'no_such_lib_xyz'\); install it with: "
                       r"pip install 'physai-flows\[probe\]'$"):
        fmt.write(tmp_path / "out", None)  # type: ignore[arg-type]
    typo = DatasetFormat("probe", "a probe", "physai_core.plugins:reed", "physai_core.plugins:wrte",
                         extra="probe")
    with pytest.raises(RefError, match=r"^dataset format 'probe' "
                       r"'physai_core.plugins:wrte': module "
                                       r"'physai_core.plugins' has no attribute 'wrte'$"):
        typo.write(tmp_path / "out", None)  # type: ignore[arg-type]
