import pytest

pytest.importorskip("transformers.models.lfm3", reason="LFM3 arrives in transformers after 5.17")

from nnterp.testing import AttentionSuite, LayerSuite  # noqa: E402
from nnterp_shortconv.testing import ShortConvSuite  # noqa: E402

SAME_MIXER = "the pairs on generate steps are ShortConv's, run on lfm2; LFM3 changes only where its output is added"


class TestLfm3(LayerSuite, AttentionSuite, ShortConvSuite):
    family = "lfm3"

    def test_every_pair_of_reads_on_every_generate_step(self) -> None:
        pytest.skip(SAME_MIXER)
