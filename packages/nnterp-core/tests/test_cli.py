import dataclasses
import importlib.metadata
import io
import json
import subprocess
import sys
import types
import unittest

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import nnterp
from nnterp import EProperty, Layer, cli
from nnterp.layouts import Residual
from nnterp.registry import family_name
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


class ToySuite:
    """A suite as the conformance suites are written: pytest's style, run by nnterp check through unittest."""

    torn_down = False

    @classmethod
    def setup_class(cls):
        cls.value = 1

    @classmethod
    def teardown_class(cls):
        ToySuite.torn_down = True

    def test_reads_what_setup_class_made(self):
        assert self.value == 1

    def test_a_failing_check(self):
        assert self.value == 2, "value is not 2"

    def test_a_check_this_model_cannot_make(self):
        raise unittest.SkipTest("not on this model")


class UnbuildableSuite:
    @classmethod
    def setup_class(cls):
        raise RuntimeError("the tiny model cannot be built")

    def test_never_runs(self):
        pass


def test_check_runs_a_suite_with_unittest_counting_and_naming_what_failed():
    result = cli.run_suite(ToySuite, io.StringIO(), "toy")
    assert (result.passed, len(result.skipped)) == (1, 1)
    ((test, error),) = result.problems
    assert test == "test_a_failing_check" and "value is not 2" in error
    assert ToySuite.torn_down
    result = cli.run_suite(UnbuildableSuite, io.StringIO(), "unbuildable")
    assert result.passed == 0
    ((test, error),) = result.problems
    assert test == "setup_class" and "the tiny model cannot be built" in error


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


def test_coverage_lists_every_causal_lm_with_the_family_that_serves_it(core_plugin):
    rows = nnterp.coverage()
    families = nnterp.REGISTRY.families().values()
    wrappers = [f.CAUSAL_LM.config_class.model_type for f in families if hasattr(f, "CAUSAL_LM")]
    assert [row.model_type for row in rows] == [*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *wrappers]
    olmo = next(row for row in rows if row.model_type == "olmo")
    assert (olmo.family, olmo.plugin, olmo.served) == ("olmo", "core-tests", True)


def test_coverage_follows_a_plugin_that_claims_a_model_type():
    """A type no family serves is listed as such until a plugin claims it; then it names that plugin and family."""
    claimed = types.ModuleType("claiming_plugin.families.xlnet_stand_in")
    claimed.MODEL_TYPES = ("xlnet",)
    claimed.ENVOYS, claimed.RENAME, claimed.TINY_CONFIG = {}, {}, {}

    class Claiming:
        @nnterp.hookimpl
        def nnterp_families(self):
            return [claimed]

    def xlnet():
        return next(row for row in nnterp.coverage() if row.model_type == "xlnet")

    assert not xlnet().served
    nnterp.REGISTRY.register(Claiming(), name="claiming")
    try:
        row = xlnet()
    finally:
        nnterp.REGISTRY.unregister("claiming")
    assert (row.family, row.plugin, row.served) == ("xlnet_stand_in", "claiming", True)


def test_coverage_lists_a_multimodal_type_a_family_loads_for_text():
    """A wrapper transformers maps to no causal LM is listed once a family declares it its CAUSAL_LM; the text
    config's type the family names beside it is not a causal LM of its own."""
    from transformers import PaliGemmaForConditionalGeneration

    wrapper = types.ModuleType("wrapping_plugin.families.paligemma_for_text")
    wrapper.MODEL_TYPES, wrapper.CAUSAL_LM = ("paligemma", "siglip_text_model"), PaliGemmaForConditionalGeneration
    wrapper.ENVOYS, wrapper.RENAME, wrapper.TINY_CONFIG = {}, {}, {}

    class Wrapping:
        @nnterp.hookimpl
        def nnterp_families(self):
            return [wrapper]

    assert "paligemma" not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    assert "paligemma" not in [row.model_type for row in nnterp.coverage()]
    nnterp.REGISTRY.register(Wrapping(), name="wrapping")
    try:
        rows = nnterp.coverage()
    finally:
        nnterp.REGISTRY.unregister("wrapping")
    assert [row.model_type for row in rows][: len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)] == list(
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    assert (rows[-1].model_type, rows[-1].family, rows[-1].plugin) == ("paligemma", "paligemma_for_text", "wrapping")
    assert "siglip_text_model" not in [row.model_type for row in rows]


def test_coverage_finds_the_recurrent_kernels_a_modeling_module_declares():
    kernels = {row.model_type: row.recurrent_kernels for row in nnterp.coverage()}
    assert {"selective_scan_fn", "selective_state_update"} <= set(kernels["mamba"])
    assert {"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"} <= set(kernels["qwen3_next"])
    assert "mamba_chunk_scan_combined" in kernels["mamba2"]
    # a softmax-attention model, and one whose only hub kernels are convolutions, declare none
    assert kernels["llama"] == ()


def test_coverage_command_prints_a_line_per_type_and_a_summary_that_adds_up(core_plugin):
    out = io.StringIO()
    assert cli.coverage(out, as_json=False, run_checks=None) == 0
    *lines, summary = out.getvalue().splitlines()
    rows = nnterp.coverage()
    assert [line.split()[0] for line in lines] == [row.model_type for row in rows]
    recurrent = [row for row in rows if row.recurrent_kernels]
    generic = [row for row in rows if row.generic]
    assert summary == (
        f"{sum(row.served for row in rows)} of {len(rows)} causal-LM model types served "
        f"({len(generic)} by a generic family); "
        f"{sum(row.served for row in recurrent)} of the {len(recurrent)} with a recurrent kernel"
    )
    for line, row in zip(lines, rows, strict=True):
        assert ("generic (" in line) == bool(row.generic), line
        assert line.split(None, 1)[1].startswith(("not served: ", "partly served: ")) == (not row.served), line
        assert line.split(None, 1)[1].startswith("partly served: ") == bool(row.partly), line
    flagged = {line.split()[0] for line in lines if "NO FAMILY SERVES ITS RECURRENT KERNEL" in line}
    assert flagged == {row.model_type for row in recurrent if not row.served}

    out = io.StringIO()
    assert cli.coverage(out, as_json=True, run_checks=None) == 0
    assert json.loads(out.getvalue()) == [
        {
            **dataclasses.asdict(row),
            "recurrent_kernels": list(row.recurrent_kernels),
            "partly": list(row.partly),
            "served": row.served,
        }
        for row in rows
    ]


def test_coverage_check_runs_the_suites_of_every_serving_family_and_fails_with_them(core_plugin, monkeypatch):
    checked = []

    def failing_check(out, families):
        checked.extend(family_name(family) for family in families)
        return 1

    monkeypatch.setattr(cli, "check_families", failing_check)
    assert cli.coverage(io.StringIO(), as_json=False, run_checks="all") == 1
    assert sorted(checked) == sorted({row.family for row in nnterp.coverage() if row.served})
    assert len(checked) == len(set(checked))
    assert "olmo" in checked
    # CI's form: a named family's suites run in its package's tests, so only the generic families are checked
    checked.clear()
    assert cli.coverage(io.StringIO(), as_json=False, run_checks="generic") == 1
    assert sorted(checked) == sorted({row.family for row in nnterp.coverage() if row.generic})
    assert "olmo" not in checked
