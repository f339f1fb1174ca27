import importlib.metadata
import io
import subprocess
import sys
import types

import nnterp
from nnterp import EProperty, Layer, cli
from nnterp.layouts import Residual
from nnterp.testing import save_tiny


def run(*argv):
    out = io.StringIO()
    command, *rest = argv
    if command == "plugins":
        code = cli.plugins(out)
    elif command == "support":
        code = cli.support(out, rest[0] if rest else None)
    else:
        code = cli.check(out, list(rest))
    return code, out.getvalue()


def test_plugins_lists_each_plugin_with_its_families(core_plugin):
    code, text = run("plugins")
    assert code == 0
    assert "core-tests (registered directly)" in text
    assert "  olmo: olmo" in text


def test_installed_entry_points_are_listed_by_the_command(core_plugin):
    result = subprocess.run([sys.executable, "-m", "nnterp", "plugins"], capture_output=True, text=True, check=True)
    for entry_point in importlib.metadata.entry_points(group="nnterp"):
        assert f"{entry_point.name} ({entry_point.dist.name} {entry_point.dist.version})" in result.stdout


def test_check_passes_a_conforming_family(core_plugin):
    code, text = run("check", "olmo")
    assert code == 0, text
    assert text.startswith("olmo ok: ")
    assert " 0 failed" in text


class MisplacedOutput(Layer):
    """A family bug: the block's output pointed at its input, so the contributions cannot add up."""

    @EProperty("input")
    def layer_output(self, value) -> Residual:
        return value


def test_check_fails_a_family_whose_values_break_the_identity(core_plugin, without_core_plugin):
    broken = types.ModuleType("broken_family.families.broken_olmo")
    broken.MODEL_TYPES = ("olmo",)
    broken.TINY_CONFIG = core_plugin.TINY_CONFIG
    broken.RENAME = {}
    broken.ENVOYS = {**core_plugin.ENVOYS, next(iter(core_plugin.ENVOYS)): MisplacedOutput}

    class Broken:
        @nnterp.hookimpl
        def nnterp_families(self):
            return [broken]

    nnterp.REGISTRY.register(Broken(), name="broken")
    try:
        code, text = run("check", "broken_olmo")
    finally:
        nnterp.REGISTRY.unregister("broken")
    assert code == 1
    assert "broken_olmo FAILED" in text
    assert "test_contributions_add_up_to_layer_output" in text


def test_check_of_an_unknown_family_exits_2_naming_it(core_plugin, capsys):
    assert cli.main(["check", "nope"]) == 2
    assert "no installed nnterp plugin provides a family named 'nope'" in capsys.readouterr().err


def test_support_of_a_model_directory(core_plugin, tmp_path):
    save_tiny("olmo", tmp_path)
    code, text = run("support", str(tmp_path))
    assert code == 0
    assert "(family olmo)" in text
    assert "  layer_output: available" in text


def test_support_of_a_path_that_is_not_a_model_exits_2(core_plugin, tmp_path, capsys):
    assert cli.main(["support", str(tmp_path / "missing")]) == 2
    assert "cannot load" in capsys.readouterr().err
