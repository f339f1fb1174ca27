"""One rank of a tensor-parallel run (``torchrun``, see test_tensor_parallel): every value support() lists, and writes.

Rank 0 saves what it read: the values served, the reasons of those refused,
the logits after a write by assignment and after the same write in place.
"""

import sys

import torch
import torch.distributed as dist
from transformers.distributed import DistributedConfig

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT

directory, out = sys.argv[1], sys.argv[2]
model = StandardizedTransformer(directory, distributed_config=DistributedConfig(tp_size=2), attn_implementation="eager")
served, refused = {}, {}
for layer in range(model.num_layers):
    for name, reason in model.support(layer=layer).items():
        owner, _, value = name.rpartition(".")
        block = model.layers[layer]
        if reason is not None:
            refused[f"{layer}.{name}"] = reason
            continue
        with model.trace(PROMPT):
            saved = getattr(getattr(block, owner) if owner else block, value).save()
        served[f"{layer}.{name}"] = saved
with model.trace(PROMPT):
    model.layers[0].mlp.mlp_output = model.layers[0].mlp.mlp_output * 0.5
    written = model.logits.save()
with torch.no_grad(), model.trace(PROMPT):
    model.layers[0].mlp.mlp_output[:] *= 0.5
    edited = model.logits.save()
with model.trace(PROMPT):
    mlp = model.layers[0].mlp
    projected = mlp.down_proj(torch.ones(1, 3, mlp.intermediate_size)).save()
if dist.get_rank() == 0:
    read = {"served": served, "refused": refused, "written": written, "edited": edited, "projected": projected}
    torch.save(read, out)
