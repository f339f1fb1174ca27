"""Every Python example in README.md runs as written and prints what its comments say."""

import contextlib
import io
import pathlib
import re
import runpy

README = pathlib.Path(__file__).parents[1] / "README.md"


def examples():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def expected_prints(code):
    """What each print's comment promises: on the print's own line, or on a comment line right after it."""
    expected, lines = [], code.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comment = line.partition("#")[2].strip()
        if not comment and index + 1 < len(lines) and lines[index + 1].startswith("#"):
            comment = lines[index + 1][1:].strip()
        expected.append(comment.split(":")[0] if comment.startswith("None:") else comment)
    return expected


def test_readme_examples_print_what_they_say(tmp_path, monkeypatch):
    # One script of every example, in order, as a user would paste them: nnsight reads a
    # trace's body back from its source file, so the code has to live in a real file.
    monkeypatch.chdir(tmp_path)
    code = "\n".join(examples())
    script = tmp_path / "readme_examples.py"
    script.write_text(code)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="readme_examples")
    assert out.getvalue().splitlines() == expected_prints(code)


def test_readme_census_tables_are_what_the_census_writes():
    """The README's census and mixer-kind tables are `nnterp coverage --markdown` on the release it names.

    Run as a user runs it, in a process of its own: a test that registers a plugin of its own changes the census of
    the process it runs in.
    """
    import subprocess
    import sys

    import pytest
    import transformers

    import nnterp
    from nnterp.registry import OFFICIAL_PLUGINS

    text = README.read_text()
    stated = re.search(r"on transformers (\S+) with every official plugin installed", text).group(1)
    installed = {info.distribution for info in nnterp.REGISTRY.plugins()}
    if transformers.__version__ != stated or not set(OFFICIAL_PLUGINS) <= installed:
        pytest.skip(f"the README's census is of transformers {stated} with every official plugin installed")
    block = re.search(r"<!-- nnterp coverage --markdown -->\n(.*)<!-- /nnterp coverage --markdown -->", text, re.S)
    written = subprocess.run(
        [sys.executable, "-m", "nnterp", "coverage", "--markdown"], capture_output=True, text=True, check=True
    ).stdout
    assert block.group(1) == written, "regenerate the README's tables with `nnterp coverage --markdown`"


def test_writing_a_plugin_names_every_name_a_family_declares():
    """The README's "Writing a plugin" names each field of nnterp.family.Family, and no declaration that is not one."""
    from nnterp.family import FIELDS

    section = README.read_text().partition("## Writing a plugin")[2].partition("\n## ")[0]
    named = set(re.findall(r"`([A-Za-z_]+)`", section)) | set(re.findall(r"^([A-Z_]+) = ", section, flags=re.M))
    assert set(FIELDS) <= named, f"the README does not name {sorted(set(FIELDS) - named)}"
    declarations = set(re.findall(r"^([A-Z][A-Z_]+) = ", section, flags=re.M))
    assert declarations <= set(FIELDS), f"the README's examples declare {sorted(declarations - set(FIELDS))}"
