"""Which conformance suites a family gets: the one place that decides, for ``nnterp check`` and for pytest.

Every suite is registered by the envoy class it tests, through the plugins'
``nnterp_suites`` hook (core's own through its built-in plugin), and a family
gets the suite of every envoy class its tiny model has. ``LayerSuite`` checks
that a hand-assembled test class runs exactly these.
"""

from __future__ import annotations

import unittest
from pathlib import Path
from types import ModuleType

from ..family import declared
from ..registry import REGISTRY, family_name


def suite_for(family: ModuleType) -> type:
    """The conformance suite class of a family: the suite of every standard envoy class its loads wrap.

    The envoy classes are the family's ``ENVOYS``, and a multimodal
    wrapper's text model's (the family of its tiny config's ``text_config``),
    as a load of the family uses them; the suite builds its own model.
    """
    from ..transformer import family_tables
    from .models import tiny_config
    from .vision import VisionSuite

    envoys, _ = family_tables(family, tiny_config(family))
    envoy_types = {envoy for envoy in envoys.values() if isinstance(envoy, type)}
    suites: list[type] = []
    for envoy_class, suite in REGISTRY.suites().items():
        if suite not in suites and any(issubclass(kind, envoy_class) for kind in envoy_types):
            suites.append(suite)
    # A suite that extends another (a packed tower's VisionSuite, a hyper-connection block's LayerSuite) replaces it.
    suites = [suite for suite in suites if not any(other is not suite and issubclass(other, suite) for other in suites)]
    # The vision suite first: it builds the model with its processor, where the text side's suites run too.
    suites.sort(key=lambda suite: not issubclass(suite, VisionSuite))
    # A generic family is registered under no name, so its suite holds the module itself.
    named = family if declared(family).GENERIC else family_name(family)
    return type(f"Check_{family_name(family)}", tuple(suites), {"family": named})


def family_suite(family: str | ModuleType, *extending: type) -> type:
    """The suites ``nnterp check`` runs on ``family`` (``suite_for``), as the one base of the family's test class.

    A family's tests subclass it and add their own checks, so pytest runs
    exactly what ``nnterp check`` runs, and a suite taken out of
    ``suite_for`` leaves both. ``extending`` are suites that each extend one
    of them and run in its place, where a family's model has more to check
    (``AlibiAttentionSuite`` for ``AttentionSuite`` on a model whose scores
    carry a bias).

    Raises:
        TypeError: a suite in ``extending`` extends none of the family's.
    """
    from .models import _family

    checked = suite_for(_family(family))
    bases = list(checked.__bases__)
    for extension in extending:
        extended = next((index for index, base in enumerate(bases) if issubclass(extension, base)), None)
        if extended is None:
            raise TypeError(
                f"{extension.__name__} extends none of the suites nnterp check runs on {family_name(_family(family))} "
                f"({', '.join(base.__name__ for base in bases)}); pass a suite that extends one of them"
            )
        bases[extended] = extension
    return type(checked.__name__, tuple(bases), {"family": checked.family})


def family_test_classes(test_module: str, plugin: str) -> dict[str, type]:
    """A test class for each family of ``plugin`` that no test module beside ``test_module`` tests.

    For a plugin's ``tests/test_families.py``: a family whose tests are only
    the suites ``nnterp check`` runs needs no module of its own; one with
    checks of its own subclasses ``family_suite("<name>")`` in its module,
    and that call, found in the text of the modules beside, leaves it out
    here. The classes are named ``Test<Name>``, for pytest to collect.
    """
    here = Path(test_module).parent
    tested = "\n".join(path.read_text() for path in here.glob("test_*.py"))
    (info,) = [info for info in REGISTRY.plugins() if info.name == plugin]
    classes = {}
    for family in info.families:
        name = family_name(family)
        if f'family_suite("{name}"' not in tested:
            title = "Test" + "".join(part.title() for part in name.split("_"))
            classes[title] = type(title, (family_suite(family),), {"__module__": Path(test_module).stem})
    return classes


def as_test_case(suite: type) -> type[unittest.TestCase]:
    """A suite class (pytest's style: ``setup_class``, ``test_*`` methods) as a ``unittest.TestCase``.

    For ``nnterp check``, which runs without pytest: unittest's loader and
    runner then collect, run, skip (``unittest.SkipTest``) and report it as
    pytest does the class, its ``setup_class`` and ``teardown_class`` as the
    class fixtures.
    """
    fixtures = {"setUpClass": classmethod(lambda cls: cls.setup_class())}
    if hasattr(suite, "teardown_class"):
        fixtures["tearDownClass"] = classmethod(lambda cls: cls.teardown_class())
    return type(suite.__name__, (suite, unittest.TestCase), {**fixtures, "__module__": suite.__module__})
