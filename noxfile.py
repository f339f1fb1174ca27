"""Sessions: each package's tests against each supported transformers, the wheels, lint, the benchmarks, and releases.

    nox -s tests                     every package x every transformers version (25 environments)
    nox -s "tests(package='nnterp-mamba', transformers='5.17.0')"
    nox -s wheels                    build every wheel; install nnterp-core + nnterp-mamba alone from them; its tests
    nox -s readme                    the README's install line, verbatim, in a fresh environment (ends in `nnterp check`)
    nox -s lint
    nox -s bench
    nox -s newest                    every package with the newest transformers, past our upper bound: check + coverage
    nox -s releases [-- 5.18.0 ...]  `nnterp check` on every transformers release we support; prints a markdown table

Each tests session installs only its package and the packages it declares, so
a missing dependency or a test that leans on another plugin fails there. torch
is pinned to the build this machine has on disk (pip takes it from there; uv
and poetry would download a CUDA build of several GB).
"""

from __future__ import annotations

import collections
import json
import pathlib
import re

import nox
from packaging.requirements import Requirement
from packaging.version import Version

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "wheels", "readme"]

ROOT = pathlib.Path(__file__).parent
TORCH = "torch==2.13.0"
TRANSFORMERS = ["5.17.0", "5.20.0", "5.23.0", "5.24.0", "5.25.0"]
#: No model hub here: tiny models are built from configs.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

#: Each package and the packages of this repository it depends on, in install order.
PACKAGES = {
    "nnterp-core": [],
    "nnterp-attention": ["nnterp-core"],
    "nnterp-deltanet": ["nnterp-core", "nnterp-attention"],
    "nnterp-mamba": ["nnterp-core", "nnterp-attention"],
    "nnterp-ssd": ["nnterp-core", "nnterp-attention"],
    "nnterp-rwkv": ["nnterp-core"],
    "nnterp-rglru": ["nnterp-core", "nnterp-attention"],
    "nnterp-xlstm": ["nnterp-core"],
    "nnterp-shortconv": ["nnterp-core", "nnterp-attention"],
    "nnterp-lightning": ["nnterp-core", "nnterp-attention"],
}


#: The plugin the wheels session installs alone beside nnterp-core: it depends on another plugin, nnterp-attention.
ALONE = "nnterp-mamba"


def package_dir(name: str) -> str:
    return str(ROOT / "packages" / name)


@nox.session
@nox.parametrize("transformers", TRANSFORMERS)
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str, transformers: str) -> None:
    """One package's tests, in an environment holding it, its declared dependencies and one transformers."""
    session.install(TORCH, f"transformers=={transformers}", "pytest", "pytest-xdist", "pillow")
    session.install(*(package_dir(dependency) for dependency in PACKAGES[package]), package_dir(package))
    session.run("pytest", "-q", "-c", str(ROOT / "pyproject.toml"), package_dir(package) + "/tests", *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every wheel; install nnterp-core and one plugin from them alone, and run that plugin's tests there.

    The plugin (``ALONE``) comes with its ``test`` extra and nothing but what its wheel declares, so a
    dependency missing from its pyproject fails here: its plugin is reported as failing to load, and its
    tests find no family.
    """
    dist = session.create_tmp()
    for package in PACKAGES:
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, package_dir(package))
    session.install(TORCH)
    session.install("--find-links", dist, f"{ALONE}[test]")
    output = session.run("nnterp", "plugins", silent=True)
    session.log(output)
    if f"({ALONE} " not in output or "FAILED" in output:
        session.error(f"the {ALONE} wheel's plugin does not load beside nnterp-core alone (see above)")
    # the tests from the repository, the packages from the wheels: importlib mode puts no source tree on the path
    session.run("pytest", "-q", "-c", str(ROOT / "pyproject.toml"), package_dir(ALONE) + "/tests", env=OFFLINE)


@nox.session
def readme(session: nox.Session) -> None:
    """The README's install line, verbatim, in a fresh environment: it installs everything and ``nnterp check`` passes."""
    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("pip install "))
    session.run("bash", "-c", line, external=True, env=OFFLINE)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: the style every package shares (configured in the root pyproject.toml)."""
    session.install("ruff")
    session.run("ruff", "check", "packages", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "packages", "tests", "bench", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark in bench/, each printing its ratios measured side by side in one run."""
    session.install(TORCH, *(package_dir(package) for package in PACKAGES))
    for script in sorted((ROOT / "bench").glob("*.py")):
        if script.name != "harness.py":
            session.run("python", str(script), *session.posargs)


def install_all(session: nox.Session) -> None:
    """torch, pytest, pillow and every package of this repository, built from the working tree (not editable)."""
    session.install(TORCH, "pytest", "pytest-xdist", "pillow")
    session.install(*(package_dir(package) for package in PACKAGES))


@nox.session
def newest(session: nox.Session) -> None:
    """Every package with the newest transformers the index serves, past our upper bound: check and coverage.

    pip warns that nnterp-core requires an older transformers: that is the point. `nnterp check` then
    says which family's declaration no longer matches its model's forward; DEVELOPING.md says what
    next. `nox -s newest -- --pre` takes a release candidate. Fails if either command fails.
    """
    install_all(session)
    session.install("--upgrade", *session.posargs, "transformers")
    session.run("python", "-c", "import transformers; print('transformers', transformers.__version__)")
    failed = []
    for command in (["check"], ["coverage", "--check"]):
        try:
            session.run("nnterp", *command, env=OFFLINE)
        except nox.command.CommandFailed:
            failed.append("nnterp " + " ".join(command))
    if failed:
        session.error(f"{' and '.join(failed)} failed on the newest transformers (see above)")


def supported_releases(session: nox.Session) -> list[str]:
    """The newest patch of every transformers minor release the index serves from our lower bound on.

    The lower bound is nnterp-core's requirement's; the upper bound is ignored, so a new release
    joins the list as soon as the index serves it. Pre-releases are left out.
    """
    pyproject = (ROOT / "packages" / "nnterp-core" / "pyproject.toml").read_text()
    requirement = Requirement(re.search(r'"(transformers\b[^"]*)"', pyproject).group(1))
    lower = [s for s in requirement.specifier if s.operator in (">=", ">", "==", "~=")]
    listing = session.run("python", "-m", "pip", "index", "versions", "transformers", silent=True, log=False)
    available = next((line for line in listing.splitlines() if line.startswith("Available versions:")), None)
    if available is None:
        session.error(f"`pip index versions transformers` listed no versions:\n{listing}")
    newest: dict[tuple[int, int], Version] = {}
    for version in map(Version, available.partition(":")[2].split(",")):
        if not version.is_prerelease and all(s.contains(version) for s in lower):
            key = (version.major, version.minor)
            newest[key] = max(newest.get(key, version), version)
    return [str(version) for _, version in sorted(newest.items())]


def failure_clause(error: str) -> str:
    """The gist of a failing test's traceback: its exception's class and the first clause of its message.

    An ``Unavailable``'s message starts with the value and where it was asked for; that part is dropped.
    """
    last = error.strip().splitlines()[-1] if error.strip() else "no traceback"
    kind, _, message = last.partition(": ")
    kind = kind.rsplit(".", 1)[-1]
    if kind == "Unavailable":
        message = message.partition(": ")[2] or message
    clause = re.split(r": |; ", message, maxsplit=1)[0]
    return f"{kind}: {clause}" if clause else kind


def short_reason(failures: list[dict]) -> str:
    """A table cell for a failing family: how many of its tests failed and the gist most of them share, cut short."""
    clauses = collections.Counter(failure_clause(failure["error"]) for failure in failures)
    gist = clauses.most_common(1)[0][0]
    if len(gist) > 90:
        gist = gist[:87] + "..."
    return f"{len(failures)} failed: {gist}".replace("|", "\\|")


def releases_table(reports: dict[str, dict]) -> str:
    """A markdown table, a row per family and a column per release: ok, or why it failed.

    A family missing in a release (its model is newer than that transformers) shows "-"; a release on
    which `nnterp check` could not run shows "crashed", with why below the table.
    """
    rows: dict[str, str] = {}  # family -> plugin
    for report in reports.values():
        for family in report.get("families", []):
            rows.setdefault(family["family"], family.get("plugin") or "")
    header = []
    for version, report in reports.items():
        header.append(version if report.get("verified", True) else f"{version} (unverified)")
    lines = ["| family | " + " | ".join(header) + " |", "|---|" + "---|" * len(reports)]
    cells: dict[str, dict[str, str]] = {version: {} for version in reports}
    for version, report in reports.items():
        for family in report.get("families", []):
            if family.get("forward_changed"):
                cells[version][family["family"]] = "forward changed"
            else:
                cells[version][family["family"]] = "ok" if not family["failures"] else short_reason(family["failures"])
    for family, plugin in sorted(rows.items(), key=lambda item: (item[1], item[0])):
        name = f"{family} ({plugin})" if plugin else family
        missing = {v: "crashed" if "crashed" in reports[v] else "-" for v in reports}
        lines.append(f"| {name} | " + " | ".join(cells[v].get(family, missing[v]) for v in reports) + " |")
    totals, notes = [], []
    for version, report in reports.items():
        families = report.get("families", [])
        totals.append(f"{sum(not f['failed'] for f in families)} of {len(families)} ok")
        if "crashed" in report:
            notes.append(f"- {version}: {report['crashed']}")
        for failure in report.get("plugin_failures", []):
            notes.append(f"- {version}: plugin {failure['name']} failed to load: {failure['error']}")
    lines.append("| **all** | " + " | ".join(totals) + " |")
    return "\n".join(lines + ([""] + notes if notes else []))


@nox.session
def releases(session: nox.Session) -> None:
    """`nnterp check` on the newest patch of every transformers minor release from our lower bound on, as a table.

    nox -s releases                    every release the index serves (supported_releases)
    nox -s releases -- 5.18.0 5.21.1   those releases only

    One environment; each release in turn is installed into it and checked with `nnterp check --json`
    (the reports are kept in the session's tmp folder). Prints a markdown table of releases and
    families, ok or a short reason, for the README's "Releases" section, and writes it beside the
    reports as releases.md. A release on which `nnterp check` cannot run at all is noted below the
    table. Fails only if no release could be checked.
    """
    install_all(session)
    versions = session.posargs or supported_releases(session)
    session.log(f"transformers releases to check: {', '.join(versions)}")
    folder = pathlib.Path(session.create_tmp())
    reports: dict[str, dict] = {}
    for version in versions:
        session.install(f"transformers=={version}")
        path = folder / f"check-{version}.json"
        with path.open("w") as out:
            try:
                session.run("nnterp", "check", "--json", env=OFFLINE, stdout=out, stderr=None, success_codes=[0, 1])
            except nox.command.CommandFailed as error:
                reports[version] = {"crashed": f"`nnterp check` exited with {error.return_code}", "families": []}
                continue
        try:
            reports[version] = json.loads(path.read_text())
        except ValueError:  # an exception escaped nnterp itself: exit code 1, its traceback above, no report
            reports[version] = {"crashed": "`nnterp check` crashed before its report (traceback above)", "families": []}
    table = releases_table(reports)
    (folder / "releases.md").write_text(table + "\n")
    print(table)
    session.log(f"table and reports in {folder}")
    if all("crashed" in report for report in reports.values()):
        session.error("`nnterp check` ran on no release")
