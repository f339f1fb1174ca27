"""How a StandardizedTransformer's trace runs on an NDIF server that hosts the plain checkpoint.

nnsight ships a remote trace as its block's source and the envoys it touches;
the server runs the block against its own model. Three things make that work
for nnterp:

- The request names the plain deployment: the model key's class is nnsight's
  ``TransformersModel``, whatever wrapper the user built, so a server that
  hosts the checkpoint for everyone runs it. A model loaded from a local
  directory is keyed by that directory, for a server that has the same one.
- The standard envoys travel by reference when the server has the ``nnterp``
  packages (``nnterp-core`` and the plugin of the model's family, at the
  client's versions): it imports them. Otherwise, or when the user asks
  (:func:`ship`), they travel by value: the request carries the source of
  ``nnterp-core``, of the family's plugin and of the plugins it imports, and of
  the libraries they need that the server may lack (pluggy, jaxtyping), as one
  compressed archive, and the first thing the server unpickles installs an
  importer serving them, before any class of ours is looked up. The classes
  are then imported from that archive, by the same names, so module state
  (the registry, routing bindings) is built once on the server as on a client.
  nnsight's own by-value pickling, which it applies to editable installs,
  would instead rebuild each class apart from its module; nnterp's packages
  are taken out of it.
- Routing is a binding of the process that runs the model: a value that needs
  routed kernels (a recurrent mixer's ``states``) raises ``Unavailable`` on a
  server that has not routed them, with the reason, like any unserved value.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import lzma
import pickle
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: How requests carry nnterp: "auto", "value" or "reference" (see ``ship``).
SHIPPING = {"how": "auto"}
#: Libraries nnterp-core needs that a server with only nnsight may lack, shipped where it cannot import them.
DEPENDENCIES = ("pluggy", "jaxtyping", "wadler_lindig")
#: Our modules a server never runs (the testing kit, activation capture, the command line): not shipped.
CLIENT_ONLY = frozenset({"testing", "capture", "cli", "__main__"})


def ship(how: str) -> None:
    """Choose how remote requests carry nnterp's code: ``"auto"`` (the default), ``"value"`` or ``"reference"``.

    ``"reference"``: the server imports the ``nnterp`` packages it has
    installed, which must be the client's versions. ``"value"``: each request
    carries their source (about 100 to 150 KiB compressed), and the server
    needs none of them. ``"auto"`` asks NDIF which packages the server has
    (``nnsight.ndif.get_remote_env``) and ships by value unless it has
    ``nnterp-core`` and the model's plugin at the client's versions, or when
    it cannot ask.
    """
    if how not in ("auto", "value", "reference"):
        raise ValueError(f"ship({how!r}): requests carry nnterp by 'auto', 'value' or 'reference'")
    SHIPPING["how"] = how


def by_value(family: Any) -> bool:
    """Whether this request carries nnterp's source: the user asked, or the server lacks the packages."""
    if SHIPPING["how"] != "auto":
        return SHIPPING["how"] == "value"
    from importlib.metadata import version

    from nnsight.ndif import get_remote_env

    try:
        remote = get_remote_env().get("packages", {})
    except Exception:  # no answer from NDIF (offline, a private server): shipping the code works everywhere
        return True
    from .registry import REGISTRY

    needed = {"nnterp": "nnterp-core"}
    plugin = REGISTRY.plugin_of(family)
    if plugin is not None and plugin.distribution and _package(family) != "nnterp":
        needed[_package(family)] = plugin.distribution
    return any(remote.get(module) != version(distribution) for module, distribution in needed.items())


def _package(family: Any) -> str:
    return family.__name__.partition(".")[0]


@functools.lru_cache(maxsize=8)
def archive(package: str) -> bytes:
    """The compressed source of nnterp-core, of plugin ``package`` and the plugins it imports, and of the
    libraries in ``DEPENDENCIES``: a pickled ``{module: (source, is_package, ours)}``, lzma-compressed."""
    modules: dict[str, tuple[str, bool, bool]] = {}
    packages, seen = ["nnterp", package], set()
    while packages:
        name = packages.pop()
        if name in seen:
            continue
        seen.add(name)
        for module, source, is_package in _sources(name):
            if module.split(".")[1:2] and module.split(".")[1] in CLIENT_ONLY:
                continue
            modules[module] = (source, is_package, True)
            packages.extend(_imported_plugins(source) - seen)
    for dependency in DEPENDENCIES:
        for module, source, is_package in _sources(dependency):
            modules[module] = (source, is_package, False)
    return lzma.compress(pickle.dumps(modules, protocol=4), preset=9)


def _sources(package: str) -> list[tuple[str, str, bool]]:
    """Every module of an installed pure-Python package: its name, source, and whether it is a package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join((package, *(parts[:-1] if is_package else parts)))
        found.append((module, path.read_text(), is_package))
    return found


def _imported_plugins(source: str) -> set[str]:
    """The other nnterp plugin packages (``nnterp_*``) a module imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return {name for name in names if name.startswith("nnterp_")}


def shipped(archive: bytes, module: str, name: str) -> Any:
    """On the server, while the request unpickles: serve the archive's modules, then the class ``module.name``.

    The first object of ours in a request unpickles through this function, which
    the request carries by value (it names nothing of nnterp's), so every class
    looked up after it imports from the archive: nnterp's packages ahead of any
    the server has, the libraries only where the server cannot import them.
    Returns an empty instance of the class, for the pickle's state to fill.
    """
    import hashlib
    import importlib.abc
    import importlib.util
    import lzma
    import pickle
    import sys

    tag = hashlib.sha256(archive).hexdigest()
    if not any(getattr(finder, "nnterp_shipped_archive", None) == tag for finder in sys.meta_path):
        modules = pickle.loads(lzma.decompress(archive))

        def importable(package: str) -> bool:
            try:
                return importlib.util.find_spec(package) is not None
            except ImportError:
                return False

        packages = {module.partition(".")[0]: ours for module, (_, _, ours) in modules.items()}
        served = {package for package, ours in packages.items() if ours or not importable(package)}

        class Shipped(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            nnterp_shipped_archive = tag

            def find_spec(self, fullname, path=None, target=None):
                if fullname not in modules or fullname.partition(".")[0] not in served:
                    return None
                return importlib.util.spec_from_loader(
                    fullname, self, origin=f"<shipped>/{fullname}", is_package=modules[fullname][1]
                )

            def create_module(self, spec):
                return None

            def exec_module(self, module):
                source = modules[module.__spec__.name][0]
                exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)

        sys.meta_path.insert(0, Shipped())
    kind = getattr(importlib.import_module(module), name)
    return kind.__new__(kind)


def carried(function: Callable) -> Callable:
    """``function`` as a request pickles it by value, source and all: the server needs nothing of ours to run it.

    A function of an importable module pickles as a reference to it; one of
    ``__main__`` pickles by value (cloudpickle), which nnsight does from its source.
    """
    copy = types.FunctionType(function.__code__, {"__builtins__": builtins}, function.__name__)
    copy.__module__ = "__main__"
    return copy


def exclude_from_nnsight_by_value() -> None:
    """Keep nnterp and its plugins out of the modules nnsight serializes by value (see the module)."""
    from cloudpickle.cloudpickle import _PICKLE_BY_VALUE_MODULES
    from nnsight.ndif import pull_env

    from .registry import REGISTRY

    pull_env()  # registers every editable install by value, once per process; undone for ours below
    # A plugin is a module, or an object registered directly (whose class's module is its package's).
    plugins = (getattr(info.module, "__name__", type(info.module).__module__) for info in REGISTRY.plugins())
    _PICKLE_BY_VALUE_MODULES.difference_update({"nnterp"} | {name.partition(".")[0] for name in plugins})
