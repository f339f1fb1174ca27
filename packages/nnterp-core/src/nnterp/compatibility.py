"""The transformers releases nnterp was verified on, and the warning when the installed one lies outside them.

The verified range is nnterp-core's own requirement on transformers (``transformers>=5.17,<5.26``
in its ``pyproject.toml``), read from the installed distribution's metadata, so the range lives in
one place: the upper bound is the newest release every family was checked on (``nox -s
releases``, DEVELOPING.md). pip keeps transformers inside it, but a later ``pip install -U
transformers`` does not ask nnterp; outside it, a model whose forward changed no longer matches
its family's declaration, and that family's values are unavailable. ``import nnterp`` (first
thing, so the warning comes before any import a new release breaks) and ``nnterp check`` warn
about it, once per process, with ``UnverifiedTransformersWarning``. Silence it with
``warnings.filterwarnings("ignore", category=nnterp.UnverifiedTransformersWarning)`` or, before
``import nnterp``, ``warnings.filterwarnings("ignore", module="nnterp.compatibility")``
(``PYTHONWARNINGS=ignore::UserWarning:nnterp.compatibility``).
"""

from __future__ import annotations

import importlib.metadata
import warnings

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: The distribution whose requirement on transformers is the verified range.
DISTRIBUTION = "nnterp-core"

_warned = False


class UnverifiedTransformersWarning(UserWarning):
    """The installed transformers lies outside the releases this nnterp was verified on.

    Families whose model's forward changed in it report their values unavailable; the others work.
    """


def verified_range() -> SpecifierSet | None:
    """The transformers releases nnterp-core was verified on, from its installed metadata.

    ``None`` when nnterp-core is not installed as a distribution (its source put on ``sys.path``
    by hand) or declares no requirement on transformers: then there is nothing to check against.
    """
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == "transformers" and (requirement.marker is None or requirement.marker.evaluate()):
            return requirement.specifier
    return None


def installed_transformers() -> str:
    """The installed transformers' version, from its metadata (without importing it)."""
    return importlib.metadata.version("transformers")


def _spelled(specifiers) -> str:
    """``>=5.17,<5.26``: the lower bounds first, as pyproject.toml writes them (SpecifierSet sorts them)."""
    return ",".join(str(s) for s in sorted(specifiers, key=lambda s: (s.operator.startswith("<"), str(s))))


def unverified_message(version: str | None = None) -> str | None:
    """What the warning says about transformers ``version`` (the installed one by default); ``None`` inside the range.

    A version that does not parse is outside it.
    """
    verified = verified_range()
    if verified is None:
        return None
    version = installed_transformers() if version is None else version
    try:
        parsed = Version(version)
    except InvalidVersion:
        broken = list(verified)
    else:
        if verified.contains(parsed, prereleases=True):
            return None
        broken = [s for s in verified if not s.contains(parsed, prereleases=True)]
    too_new = any(s.operator.startswith("<") for s in broken)
    fix = f'pin `pip install "transformers{_spelled(broken)}"`'
    if too_new:
        fix += (
            f", or check for a newer nnterp (`pip install --upgrade nnterp-core` and its plugins) verified on {version}"
        )
    return (
        f"transformers {version} is installed, outside the releases {DISTRIBUTION} "
        f"{importlib.metadata.version(DISTRIBUTION)} was verified on (transformers{_spelled(verified)}). "
        f"A family whose model's forward changed in {version} reports its values unavailable, naming the family "
        f"(`nnterp check` runs every family's suites and says which); the others work as verified. "
        f"To stay on verified releases, {fix}."
    )


def status() -> dict[str, str | bool | None]:
    """The installed transformers, the verified range and whether it lies inside, as ``nnterp check --json`` reports."""
    verified = verified_range()
    return {
        "transformers": installed_transformers(),
        "verified_range": None if verified is None else _spelled(verified),
        "verified": unverified_message() is None,
    }


def warn_if_unverified() -> None:
    """Warn, once per process, when the installed transformers lies outside the verified range."""
    global _warned
    if _warned:
        return
    _warned = True
    message = unverified_message()
    if message is not None:
        warnings.warn(message, UnverifiedTransformersWarning, stacklevel=1)


# nnterp/__init__.py imports this module first, so the warning precedes anything a new transformers breaks.
warn_if_unverified()
