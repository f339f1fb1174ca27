import pytest

from nnterp.testing import family_suite

#: The trace contract's matrix over generate steps is the mixer class's: test_lfm2 runs it on the same ShortConv.
SAME_MIXER = "the pairs on generate steps are ShortConv's, run on lfm2; this family's blocks add nothing to them"


class TestLfm2Moe(family_suite("lfm2_moe")):
    def test_every_pair_of_reads_on_every_generate_step(self) -> None:
        pytest.skip(SAME_MIXER)
