"""One function decides a family's suites: ``nnterp check`` and every family's test class take them from it."""

import pytest

import nnterp
from nnterp.components.moe import Moe
from nnterp.registry import REGISTRY
from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite
from nnterp.testing.assembly import family_suite, family_test_classes, suite_for


def test_a_suite_taken_out_of_the_assembly_leaves_nnterp_check_and_the_test_classes(monkeypatch):
    assert MoeSuite in suite_for(nnterp.families.mixtral).__bases__
    assert issubclass(family_suite("mixtral"), MoeSuite)
    without = {envoy: suite for envoy, suite in REGISTRY.suites().items() if envoy is not Moe}
    monkeypatch.setattr(type(REGISTRY), "suites", lambda self: without)
    assert MoeSuite not in suite_for(nnterp.families.mixtral).__mro__
    assert not issubclass(family_suite("mixtral"), MoeSuite)
    assert set(family_suite("mixtral").__bases__) == {LayerSuite, AttentionSuite}


def test_a_suite_in_place_of_one_must_extend_it():
    from nnterp_attention.testing import AlibiAttentionSuite

    # Doge's attention is the standard one, checked by AttentionSuite; its scores carry a bias AlibiAttentionSuite checks
    assert AttentionSuite in suite_for(nnterp.families.doge).__bases__
    doge = family_suite("doge", AlibiAttentionSuite)
    assert AlibiAttentionSuite in doge.__bases__ and AttentionSuite not in doge.__bases__
    with pytest.raises(TypeError, match=r"MoeSuite extends none of the suites nnterp check runs on llama"):
        family_suite("llama", MoeSuite)


def test_a_family_tested_in_its_own_module_gets_no_generated_class(tmp_path):
    (tmp_path / "test_llama.py").write_text('class TestLlama(family_suite("llama")):\n    pass\n')
    generated = family_test_classes(str(tmp_path / "test_families.py"), "attention")
    assert "TestLlama" not in generated and "TestMistral" in generated
    assert generated["TestMistral"].family == "mistral" and issubclass(generated["TestMistral"], LayerSuite)
