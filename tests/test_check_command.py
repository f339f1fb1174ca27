"""`nnterp check`, the README's first command, passes a family of every official plugin, as their tests do."""

import io

import pytest

from nnterp import cli
from nnterp.registry import REGISTRY, Registry

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


def test_every_familys_suites_assemble_where_pytest_is_not_installed():
    """`nnterp check` needs no pytest: a suite module importing it would fail every family that uses it."""
    import subprocess
    import sys

    script = (
        "import sys, warnings\n"
        "sys.modules['pytest'] = None\n"
        "warnings.simplefilter('ignore')\n"
        "from nnterp.registry import REGISTRY, Registry\n"
        "from nnterp.testing.assembly import as_test_case, suite_for\n"
        "for family in REGISTRY.families().values():\n"
        "    as_test_case(suite_for(family))\n"
        "print(len(REGISTRY.families()))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) == len(Registry().families())
