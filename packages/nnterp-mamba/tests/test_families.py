"""Every family of this plugin that no test module here tests: the suites `nnterp check` runs on it, nothing more."""

from nnterp.testing.assembly import family_test_classes

globals().update(family_test_classes(__file__, "mamba"))
