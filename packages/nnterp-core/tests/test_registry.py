import re
import sys
import types
import warnings

import pytest

import nnterp
from nnterp import StandardizedTransformer, UnknownFamily, UnknownModelType
from nnterp import registry as registry_module
from nnterp.registry import PluginError, Registry, installed_families


class Plugin:
    """A plugin object registered directly, as a test or a notebook does."""

    def __init__(self, families=(), namespace=None):
        self.families, self.names = list(families), dict(namespace or {})

    @nnterp.hookimpl
    def nnterp_families(self):
        return self.families

    @nnterp.hookimpl
    def nnterp_namespace(self):
        return self.names


def family_module(name, model_types):
    module = types.ModuleType(f"third_party.families.{name}")
    module.MODEL_TYPES = model_types
    module.ENVOYS, module.RENAME, module.TINY_CONFIG = {}, {}, {}
    return module


@pytest.fixture
def registered():
    names = []

    def register(plugin, name):
        names.append(nnterp.REGISTRY.register(plugin, name=name))

    yield register
    for name in names:
        nnterp.REGISTRY.unregister(name)


def test_family_resolves_by_name_and_model_type(core_plugin):
    assert nnterp.families.olmo is core_plugin
    assert nnterp.REGISTRY.family_for("olmo") is core_plugin
    assert "olmo" in dir(nnterp.families)


def test_unknown_family_names_the_installed_ones(core_plugin):
    with pytest.raises(
        UnknownFamily, match="no installed nnterp plugin provides a family named 'nope'; installed families: .*olmo"
    ):
        nnterp.families.nope
    assert not hasattr(nnterp.families, "nope")


def test_a_model_type_given_as_a_family_names_the_family_that_serves_it():
    stand_in = types.ModuleType("typing_plugin.families.xlnet_stand_in")
    stand_in.MODEL_TYPES = ("xlnet",)
    stand_in.ENVOYS, stand_in.RENAME, stand_in.TINY_CONFIG = {}, {}, {}

    class Typing:
        @nnterp.hookimpl
        def nnterp_families(self):
            return [stand_in]

    nnterp.REGISTRY.register(Typing(), name="typing")
    try:
        with pytest.raises(UnknownFamily, match="'xlnet' is a model type, served by the family 'xlnet_stand_in'"):
            nnterp.REGISTRY.family("xlnet")
    finally:
        nnterp.REGISTRY.unregister("typing")


def test_unknown_model_type_names_it_the_plugins_and_the_official_plugins_not_installed(core_plugin, monkeypatch):
    monkeypatch.setattr(
        registry_module,
        "OFFICIAL_PLUGINS",
        {"nnterp-core": "the descriptor", "nnterp-xlnet": "XLNet's two-stream attention"},
    )
    with pytest.raises(UnknownModelType) as raised:
        nnterp.REGISTRY.family_for("xlnet")
    message = str(raised.value)
    assert "model_type 'xlnet'" in message
    assert "core-tests (registered directly)" in message
    assert "official plugins not installed here are nnterp-xlnet (XLNet's two-stream attention). " in message
    assert message.endswith("pip install nnterp-xlnet")
    assert raised.value.distribution is None


def test_loading_a_model_no_plugin_handles_fails_before_loading_it():
    from transformers import AutoConfig, AutoModelForCausalLM

    unhandled = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("xlnet", vocab_size=64, d_model=16, n_layer=1, n_head=2, d_inner=32)
    )
    with pytest.raises(UnknownModelType, match="model_type 'xlnet'"):
        StandardizedTransformer(unhandled)


def test_two_plugins_claiming_one_model_type_is_an_error_naming_both(core_plugin, registered):
    registered(Plugin([family_module("rival_olmo", ("olmo",))]), name="rival")
    with pytest.raises(PluginError, match="model_type 'olmo' is claimed by two plugins: 'core-tests' .*'rival'"):
        nnterp.REGISTRY.family_for("olmo")


def test_plugin_namespace_names_resolve_on_nnterp(registered):
    marker = object()
    registered(Plugin(namespace={"route_something": marker}), name="namespaced")
    assert nnterp.route_something is marker
    with pytest.raises(AttributeError, match="names added by installed plugins: .*route_something"):
        nnterp.no_such_name


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_work(tmp_path, monkeypatch):
    """Two installed distributions: the working one adds a family without core knowing of it, and the broken one is
    named, from its metadata, to a model of the type it declares."""
    MODEL_TYPE = {"broken": "xlnet", "working": "solo"}
    (tmp_path / "broken_plugin.py").write_text("raise ImportError('needs a package that is not installed')\n")
    (tmp_path / "working_plugin.py").write_text(
        "import types, nnterp\n"
        "family = types.ModuleType('working_plugin.families.solo')\n"
        "family.MODEL_TYPES = ('solo',)\n"
        "family.ENVOYS, family.RENAME, family.TINY_CONFIG = {}, {}, {}\n"
        "@nnterp.hookimpl\n"
        "def nnterp_families():\n"
        "    return [family]\n"
    )
    for name, module in (("broken", "broken_plugin"), ("working", "working_plugin")):
        info = tmp_path / f"nnterp_{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nnterp-{name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(
            f"[nnterp]\n{name} = {module}\n[nnterp.model_types]\n{MODEL_TYPE[name]} = {module}.families.{MODEL_TYPE[name]}\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.load()
    failure = next(f for f in registry.failures if f.name == "broken")
    assert failure.distribution == "nnterp-broken"
    assert "ImportError: needs a package that is not installed" in failure.error
    assert any("'broken' (distribution nnterp-broken) failed to import" in str(w.message) for w in caught)
    assert registry.family_for("solo").MODEL_TYPES == ("solo",)
    # the broken distribution's metadata names it for its model type, though its plugin never imported
    with pytest.raises(
        UnknownModelType, match=r"nnterp-broken declares it .*'broken' failed .*needs a package"
    ) as raised:
        registry.family_for("xlnet")
    assert raised.value.distribution == "nnterp-broken"
    sys.modules.pop("working_plugin", None)


def test_a_plugin_whose_hook_raises_is_reported_and_skipped(core_plugin, registered):
    class Raising:
        @nnterp.hookimpl
        def nnterp_families(self):
            raise ImportError("No module named 'nnterp_half_written'")

    registered(Raising(), name="raising")
    with pytest.warns(UserWarning, match="'raising' .* failed in its nnterp_families hook and is skipped"):
        assert nnterp.REGISTRY.family_for("olmo") is core_plugin
    assert "raising" not in [info.name for info in nnterp.REGISTRY.plugins()]
    assert any(
        failure.name == "raising" and "nnterp_half_written" in failure.error for failure in nnterp.REGISTRY.failures
    )


def test_a_raising_generic_family_hook_is_reported_and_the_next_plugin_still_serves(registered):
    """Registered last, the raising hook is called first: its failure must not stop the generic family after it."""
    from transformers import AutoConfig

    class Raising:
        @nnterp.hookimpl
        def nnterp_generic_family(self, config):
            raise KeyError("layer_types")

    registered(Raising(), name="raising-generic")
    with pytest.warns(UserWarning, match="'raising-generic' .* failed in its nnterp_generic_family hook"):
        family = nnterp.REGISTRY.family_for("cohere", AutoConfig.for_model("cohere"))
    assert family.GENERIC and family.MODEL_TYPES == ("cohere",)
    assert any(
        failure.name == "raising-generic" and "layer_types" in failure.error for failure in nnterp.REGISTRY.failures
    )


def test_core_suites_are_a_plugin_of_every_registry_and_go_with_it():
    """Core's suites reach ``nnterp check`` only through its built-in plugin, as a plugin's do."""
    from nnterp.components.layer import Layer
    from nnterp.components.moe import Moe
    from nnterp.testing import LayerSuite, MoeSuite
    from nnterp.testing.assembly import suite_for

    registry = Registry()
    (core,) = [info for info in registry.plugins() if info.name == "nnterp"]
    assert core.distribution == "nnterp-core" and not core.families
    assert registry.suites()[Layer] is LayerSuite and registry.suites()[Moe] is MoeSuite
    assert {LayerSuite, MoeSuite} <= set(suite_for(nnterp.families.mixtral).__mro__)
    registry.unregister("nnterp")
    assert Layer not in registry.suites() and Moe not in registry.suites()


def test_installed_families_leaves_out_a_family_of_a_model_this_transformers_lacks(tmp_path, monkeypatch):
    """A family of a later transformers' model is skipped on this one; a family's own missing import still raises."""
    (tmp_path / "later_family.py").write_text("from transformers.models.a_model_of_a_later_release import modeling\n")
    (tmp_path / "broken_family.py").write_text("import a_dependency_nobody_installed\n")
    (tmp_path / "present_family.py").write_text("from transformers.models.llama import modeling_llama as MODELING\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = installed_families("later_family", "present_family")
    assert [family.__name__ for family in found] == ["present_family"]
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed"):
        installed_families("broken_family")


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        ("family.TINY_CONFG = {}", r"solo declares TINY_CONFG, which nnterp does not read: did you mean TINY_CONFIG\?"),
        ("family.no_images = 'x'", r"solo declares no_images, which nnterp does not read: did you mean NO_IMAGES\?"),
        ("family.MODEL_TYPES = ['solo']", r"solo declares MODEL_TYPES as list \['solo'\], not tuple\[str, \.\.\.\]"),
        ("family.ATTENDS_BOTH_WAYS = 'yes'", r"solo declares ATTENDS_BOTH_WAYS as str 'yes', not <class 'bool'>"),
        ("del family.RENAME", r"solo does not declare RENAME, which every family must"),
    ],
    ids=["misspelled", "wrong_case", "wrong_type", "wrong_type_flag", "missing"],
)
def test_a_misdeclared_family_fails_its_plugin_naming_the_family_and_the_name(declare, message):
    """A family is checked against nnterp.family.Family when its plugin registers: its plugin is reported and
    skipped, the others work, and the warning names the family and the name."""
    family = family_module("solo", ("solo",))
    exec(declare, {"family": family})

    class Misdeclaring:
        @nnterp.hookimpl
        def nnterp_families(self):
            return [family]

    registry = Registry()
    registry.register(Misdeclaring(), name="misdeclaring")
    with pytest.warns(UserWarning, match=r"plugin 'misdeclaring' .* failed to declare its families"):
        families = registry.families()
    assert "solo" not in families and "llama" in families
    (failure,) = [failure for failure in registry.failures if failure.name == "misdeclaring"]
    assert re.search(message, failure.error), failure.error
