"""A character-level tokenizer built locally, for models that have no tokenizer of their own here."""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "</s>", "<s>", "<unk>")
CHARACTERS = " " + string.ascii_lowercase + string.ascii_uppercase + ".,!?'-:;" + string.digits


def local_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """A character-level tokenizer of ``vocab_size`` tokens: pad 0, eos 1, bos 2, unk 3, then characters.

    Built from the ``tokenizers`` library with nothing downloaded; characters
    beyond the vocabulary map to ``<unk>``. It saves and loads back like any
    fast tokenizer (``save_pretrained`` / ``AutoTokenizer.from_pretrained``).
    """
    symbols = list(SPECIAL_TOKENS) + list(CHARACTERS)
    vocab = {symbol: index for index, symbol in enumerate(symbols[:vocab_size])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )
