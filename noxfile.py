"""Sessions: each package's tests against each supported transformers, the wheels, lint and the benchmarks.

    nox -s tests                     every package x every transformers version (20 environments)
    nox -s "tests(package='nnterp-mamba', transformers='5.17.0')"
    nox -s wheels                    build every wheel; install nnterp-core + nnterp-mamba alone; run `nnterp plugins`
    nox -s lint
    nox -s bench

Each tests session installs only its package and the packages it declares, so
a missing dependency or a test that leans on another plugin fails there. torch
is pinned to the build this machine has on disk (pip takes it from there; uv
and poetry would download a CUDA build of several GB).
"""

from __future__ import annotations

import pathlib

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "wheels"]

ROOT = pathlib.Path(__file__).parent
TORCH = "torch==2.13.0"
TRANSFORMERS = ["5.17.0", "5.20.0", "5.23.0", "5.24.0"]

#: Each package and the packages of this repository it depends on, in install order.
PACKAGES = {
    "nnterp-core": [],
    "nnterp-attention": ["nnterp-core"],
    "nnterp-deltanet": ["nnterp-core", "nnterp-attention"],
    "nnterp-mamba": ["nnterp-core", "nnterp-attention"],
    "nnterp-ssd": ["nnterp-core", "nnterp-attention"],
}


def package_dir(name: str) -> str:
    return str(ROOT / "packages" / name)


@nox.session
@nox.parametrize("transformers", TRANSFORMERS)
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str, transformers: str) -> None:
    """One package's tests, in an environment holding it, its declared dependencies and one transformers."""
    session.install(TORCH, f"transformers=={transformers}", "pytest", "pillow")
    session.install(*(package_dir(dependency) for dependency in PACKAGES[package]), package_dir(package))
    session.run("pytest", "-q", "-c", str(ROOT / "pyproject.toml"), package_dir(package) + "/tests", *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every wheel, then install nnterp-core and nnterp-mamba from them alone and list the plugins."""
    dist = session.create_tmp()
    for package in PACKAGES:
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", dist, package_dir(package))
    session.install(TORCH)
    session.install("--find-links", dist, "nnterp-core", "nnterp-mamba")
    output = session.run("nnterp", "plugins", silent=True)
    session.log(output)
    if "mamba (nnterp-mamba" not in output:
        session.error("the nnterp-mamba wheel's plugin is not listed by `nnterp plugins`")


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
