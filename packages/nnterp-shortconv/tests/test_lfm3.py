import pytest

from nnterp.testing import family_suite

pytest.importorskip("transformers.models.lfm3", reason="LFM3 arrives in transformers after 5.17")


SAME_MIXER = "the pairs on generate steps are ShortConv's, run on lfm2; LFM3 changes only where its output is added"


class TestLfm3(family_suite("lfm3")):
    def test_every_pair_of_reads_on_every_generate_step(self) -> None:
        pytest.skip(SAME_MIXER)
