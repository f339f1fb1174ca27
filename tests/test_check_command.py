"""`nnterp check`, the README's first command, passes a family of every official plugin, as their tests do."""

import io

import pytest

from nnterp import cli
from nnterp.registry import REGISTRY

#: A family per official plugin, Falcon-H1 for a family whose blocks order their sublayers their own way.
FAMILIES = ("llama", "qwen3_5_text", "mamba", "falcon_h1")


@pytest.mark.parametrize("family", FAMILIES)
def test_check_passes_each_plugins_family(family):
    if family not in REGISTRY.families():
        pytest.skip(f"the plugin providing {family} is not installed")
    out = io.StringIO()
    code = cli.check(out, [family])
    assert code == 0, out.getvalue()
    assert out.getvalue().startswith(f"{family} ok: ")
