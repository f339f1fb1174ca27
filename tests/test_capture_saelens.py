"""nnterp.capture.saelens: SAELens's own ActivationsStore reads our captured rows back, and its trainer trains on them.

The rows SAELens yields are checked against each shard's rows looked up by the
token they name (``key#row``) and against the token table; the training run is
SAELens's ``SAETrainer`` over the store, as the module's docstring writes it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sae_lens")
# The store starts a new pass over a small dataset with a warning: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:All samples in the training dataset have been exhausted")

from sae_lens import (  # noqa: E402
    SAE,
    ActivationsStore,
    SAETrainer,
    StandardTrainingSAE,
    StandardTrainingSAEConfig,
)
from sae_lens.config import SAETrainerConfig  # noqa: E402

from nnterp.capture import Activations, CaptureError, Value, capture  # noqa: E402
from nnterp.capture.saelens import store_kwargs, to_saelens  # noqa: E402

TEXTS = [f"Sentence number {i} is about cats, dogs and the birds they chase." for i in range(12)]
CONTEXT = 12
RESIDUAL = "layers[0].layer_output"
HEADS = "layers[1].self_attn.attention_head_outputs"
HALF = Value(RESIDUAL, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def acts(llama, tmp_path_factory) -> Activations:
    out = tmp_path_factory.mktemp("acts")
    # Small shards: a sequence's rows never straddle two, and the dataset is joined from many.
    return capture(
        llama, TEXTS, [RESIDUAL, HEADS, HALF], out, context=CONTEXT, batch_size=3, shard_mib=0.004, progress=False
    )


def captured(acts: Activations, key: str) -> tuple[dict[tuple[int, int], torch.Tensor], dict[tuple[int, int], int]]:
    """Every row of ``key`` and every token id, by the (sequence, position) the shards say each is."""
    rows, tokens = {}, {}
    for index in range(len(acts.shards)):
        tensors = acts.shard(index)
        for row, (sequence, position) in zip(tensors[key], tensors[f"{key}#row"].tolist(), strict=True):
            rows[sequence, position] = row
        for token, sequence, position in zip(
            tensors["tokens"].tolist(),
            tensors["tokens#sequence"].tolist(),
            tensors["tokens#position"].tolist(),
            strict=True,
        ):
            tokens[sequence, position] = token
    return rows, tokens


@pytest.mark.parametrize("key", [RESIDUAL, HEADS, HALF.key])
def test_saelens_store_yields_the_captured_rows_and_tokens_of_each_sequence(acts, key, tmp_path):
    assert len(acts.shards) > 3, acts.shards
    path = to_saelens(acts, key, tmp_path / "saelens")
    sequences = len(acts)
    # Three sequences a read: the store's reshape from [sequences, context, d_in] to tokens is part of what is checked.
    store = ActivationsStore(**store_kwargs(path, store_batch_size_prompts=3))
    d_in = store.d_in
    assert (store.hook_name, store.context_size) == (key, CONTEXT)
    assert d_in == torch.Size(acts.values[key]["row_shape"]).numel()
    batches = []
    with pytest.raises(StopIteration):
        while True:
            batches.append(store.get_raw_llm_batch(raise_on_epoch_end=True))
    assert len(batches) == sequences // 3
    values = torch.cat([values for values, _ in batches])
    ids = torch.cat([ids for _, ids in batches])
    rows, tokens = captured(acts, key)
    read = sequences // 3 * 3
    assert len(rows) == len(tokens) == sequences * CONTEXT
    expected = torch.stack([rows[index // CONTEXT, index % CONTEXT] for index in range(read * CONTEXT)])
    assert values.shape == (read * CONTEXT, d_in)
    # The store casts to float32; the captured rows (bfloat16 included) are exactly representable in it.
    assert torch.equal(values, expected.reshape(-1, d_in).float())
    assert ids.tolist() == [tokens[index // CONTEXT, index % CONTEXT] for index in range(read * CONTEXT)]
    # What the trainer draws (the shuffled mixing buffer) is made of those rows.
    drawn = store.next_batch()
    assert drawn.shape == (store.train_batch_size_tokens, d_in)
    known = {tuple(row) for row in values.tolist()}
    assert all(tuple(row) in known for row in drawn.tolist())


def test_saelens_trainer_fits_an_sae_on_the_rows_and_it_reconstructs_them_better(acts, tmp_path):
    path = to_saelens(acts, RESIDUAL, tmp_path / "saelens")
    store = ActivationsStore(**store_kwargs(path, train_batch_size_tokens=32, store_batch_size_prompts=4))
    torch.manual_seed(0)
    sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=store.d_in, d_sae=4 * store.d_in, l1_coefficient=1e-3))
    rows = torch.cat([rows for rows, _ in acts.rows(RESIDUAL)])
    before = {name: parameter.detach().clone() for name, parameter in sae.named_parameters()}
    with torch.no_grad():
        error_before = (sae(rows) - rows).pow(2).mean()
    config = SAETrainerConfig(total_training_samples=32 * 60, train_batch_size_samples=32, lr=1e-2, lr_end=1e-3)
    trainer = SAETrainer(config, sae, store)
    trained = trainer.fit()
    assert trainer.n_training_steps == 60
    assert all(torch.isfinite(parameter).all() for parameter in trained.parameters())
    assert not torch.equal(before["W_dec"], trained.W_dec) and not torch.equal(before["W_enc"], trained.W_enc)
    with torch.no_grad():
        error_after = (trained(rows) - rows).pow(2).mean()
    assert torch.isfinite(error_after) and error_after < 0.5 * error_before, (error_before, error_after)
    trained.save_inference_model(tmp_path / "sae")
    loaded = SAE.load_from_disk(tmp_path / "sae")
    with torch.no_grad():
        assert torch.allclose(loaded(rows), trained(rows), atol=1e-5)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Value(RESIDUAL, reduce="mean"), "one row per sequence"),
        (Value(RESIDUAL, positions=-1), "positions=-1, not at every token"),
        (Value(RESIDUAL, positions=slice(0, 4)), "positions=0:4, not at every token"),
        (Value(RESIDUAL, reduce="topk", k=2), "top-k"),
    ],
)
def test_a_value_saelens_cannot_take_fails_before_anything_is_written(llama, value, message, tmp_path):
    acts = capture(llama, TEXTS[:4], [value], tmp_path / "acts", context=CONTEXT, progress=False)
    with pytest.raises(CaptureError, match=message):
        to_saelens(acts, value.key, tmp_path / "saelens")
    assert not (tmp_path / "saelens").exists()


def test_unpacked_captures_missing_keys_and_full_directories_fail_before_anything_is_written(llama, acts, tmp_path):
    unpacked = capture(llama, TEXTS[:4], [RESIDUAL], tmp_path / "acts", context=CONTEXT, pack=False, progress=False)
    with pytest.raises(CaptureError, match="pack=False: its sequences have different lengths"):
        to_saelens(unpacked, RESIDUAL, tmp_path / "saelens")
    with pytest.raises(CaptureError, match="holds no value 'logits'"):
        to_saelens(acts, "logits", tmp_path / "saelens")
    assert not (tmp_path / "saelens").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(CaptureError, match="not an empty directory"):
        to_saelens(acts, RESIDUAL, tmp_path / "full")
    assert [path.name for path in (tmp_path / "full").iterdir()] == ["notes.txt"]
