"""The verified transformers range: read from nnterp-core's metadata, and warned about once outside it."""

import importlib.metadata
import io
import json
import subprocess
import sys
import warnings

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import nnterp
from nnterp import UnverifiedTransformersWarning, cli, compatibility


def bounds():
    """(a release just past the verified range, its lowest release), from the range itself, so widening it needs no edit."""
    verified = compatibility.verified_range()
    upper = next(s for s in verified if s.operator == "<")
    lower = next(s for s in verified if s.operator == ">=")
    return Version(upper.version), Version(lower.version)


@pytest.fixture
def installed(monkeypatch):
    """Pretend transformers ``version`` is installed, in a process that has not warned yet."""

    def install(version):
        monkeypatch.setattr(compatibility, "installed_transformers", lambda: str(version))
        monkeypatch.setattr(compatibility, "_warned", False)

    return install


def unverified_warnings(calls=2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            compatibility.warn_if_unverified()
    return [w for w in caught if issubclass(w.category, UnverifiedTransformersWarning)]


def test_the_range_is_nnterp_cores_own_requirement():
    declared = [Requirement(r) for r in importlib.metadata.requires("nnterp-core")]
    (transformers,) = [r for r in declared if r.name == "transformers"]
    assert compatibility.verified_range() == transformers.specifier
    assert Version(importlib.metadata.version("transformers")) in transformers.specifier  # pip kept it inside


def test_a_newer_transformers_warns_once_naming_version_range_and_fix(installed):
    past, lowest = bounds()
    installed(past)
    (warning,) = unverified_warnings()
    message = str(warning.message)
    assert f"transformers {past} is installed" in message
    assert f"transformers>={lowest},<{past}" in message
    assert f"forward changed in {past} reports its values unavailable, naming the family" in message
    assert f'pip install "transformers<{past}"' in message
    assert "newer nnterp" in message
    assert warning.filename == compatibility.__file__  # so module="nnterp.compatibility" filters it


def test_a_prerelease_of_the_next_release_is_outside(installed):
    past, _ = bounds()
    installed(f"{past}.0.dev0")
    assert len(unverified_warnings()) == 1


def test_an_older_transformers_is_told_to_upgrade_not_to_wait_for_nnterp(installed):
    _, lowest = bounds()
    older = f"{lowest.major}.{lowest.minor - 1}.0" if lowest.minor else f"{lowest.major - 1}.99.0"
    installed(older)
    (warning,) = unverified_warnings()
    assert f'pip install "transformers>={lowest}"' in str(warning.message)
    assert "newer nnterp" not in str(warning.message)


@pytest.mark.parametrize("where", ["lowest", "patch"])
def test_no_warning_inside_the_range(installed, where):
    past, lowest = bounds()
    installed(str(lowest) if where == "lowest" else f"{lowest}.9")
    assert unverified_warnings() == []
    assert compatibility.status()["verified"] is True


def test_the_warning_is_filtered_by_its_category(installed):
    installed(bounds()[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=nnterp.UnverifiedTransformersWarning)
        compatibility.warn_if_unverified()
    assert caught == []


SCRIPT = """
import importlib.metadata, sys, warnings
real = importlib.metadata.version
importlib.metadata.version = lambda name: {version!r} if name == "transformers" else real(name)
warnings.simplefilter("always")
import nnterp
from nnterp import cli
sys.exit(cli.main(["check", "--json", "no-such-family"]))
"""


def test_import_and_check_warn_once_in_total():
    past, _ = bounds()
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(version=str(past))], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr  # the unknown family; the warning came before it
    assert result.stderr.count(f"transformers {past} is installed, outside") == 1, result.stderr
    assert "no-such-family" in result.stderr


def test_check_json_reports_the_release_and_each_family(core_plugin, capsys, installed):
    installed(bounds()[0])
    out = io.StringIO()
    with pytest.warns(UnverifiedTransformersWarning):
        code = cli.check(out, ["olmo"], as_json=True)
    report = json.loads(out.getvalue())
    assert code == 0
    assert report["transformers"] == str(bounds()[0]) and report["verified"] is False
    assert report["verified_range"] == compatibility._spelled(compatibility.verified_range())
    (olmo,) = report["families"]
    assert olmo["family"] == "olmo" and olmo["plugin"] == "core-tests" and olmo["model_types"] == ["olmo"]
    assert olmo["passed"] > 0 and olmo["failed"] == 0 and olmo["failures"] == []
    assert capsys.readouterr().err.startswith("olmo ok: ")  # the usual line, on stderr
