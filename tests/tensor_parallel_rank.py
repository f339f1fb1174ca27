"""One rank of a tensor-parallel run (``torchrun``, see test_tensor_parallel): every value support() lists, and writes.

``python tensor_parallel_rank.py DIRECTORY OUT [--route] VALUE... [--gradients VALUE...] [--through VALUE...]``: rank 0
saves what it read (the values served, the reasons of those refused) and,
for each ``VALUE`` (``"layer.owner.name"``), the logits after halving it by
assignment and after halving it in place under ``torch.no_grad()``, and
its value on each of three greedy decode steps; for each ``--gradients``
value, the gradients of the logits' sum with respect to it and to the
embeddings; for each ``--through`` value, read but not differentiated, the
embeddings' gradient alone (``None`` in its place for the value's own).
``--route`` routes the family's recurrent kernels to torch first, so the
per-token states are served too.
"""

import argparse

import torch
import torch.distributed as dist
from transformers.distributed import DistributedConfig

from nnterp import StandardizedTransformer, route_kernels
from nnterp.testing import PROMPT, block_value

parser = argparse.ArgumentParser()
parser.add_argument("directory")
parser.add_argument("out")
parser.add_argument("--route", action="store_true")
parser.add_argument("--gradients", nargs="*", default=[])
parser.add_argument("--through", nargs="*", default=[])
parser.add_argument("written", nargs="*")
arguments = parser.parse_intermixed_args()
model = StandardizedTransformer(
    arguments.directory, distributed_config=DistributedConfig(tp_size=2), attn_implementation="eager"
)
if arguments.route:
    route_kernels(model.family, "torch")
served, refused = {}, {}
for layer in range(model.num_layers):
    for name, reason in model.support(layer=layer).items():
        key = f"{layer}.{name}"
        if reason is not None:
            refused[key] = reason
            continue
        with model.trace(PROMPT):
            served[key] = getattr(*block_value(model, layer, name)).save()
assigned, edited = {}, {}
for key in arguments.written:
    layer, name = key.split(".", 1)
    owner, value = block_value(model, int(layer), name)
    with model.trace(PROMPT):
        setattr(owner, value, getattr(owner, value) * 0.5)
        assigned[key] = model.logits.save()
    with torch.no_grad(), model.trace(PROMPT):
        getattr(owner, value)[:] *= 0.5
        edited[key] = model.logits.save()
gradients = {}
for key in [*arguments.gradients, *arguments.through]:
    layer, name = key.split(".", 1)
    owner, value = block_value(model, int(layer), name)
    with model.trace(PROMPT):
        embedded = model.layers[0].layer_input
        read = getattr(owner, value)
        logits = model.logits
        with logits.sum().backward():
            own = read.grad.save() if key in arguments.gradients else None
            gradients[key] = (own, embedded.grad.save())
decoded = []
with model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
    for _ in tracer.iter[0:3]:
        for key in arguments.written:
            layer, name = key.split(".", 1)
            decoded.append(getattr(*block_value(model, int(layer), name)).save())
    tokens = tracer.result.save()
with model.trace(PROMPT):
    projected = model.lm_head(torch.ones(1, 3, model.hidden_size)).save()
if dist.get_rank() == 0:
    read = {"served": served, "refused": refused, "assigned": assigned, "edited": edited, "projected": projected}
    read["generated"] = (decoded, tokens)
    read["gradients"] = gradients
    torch.save(read, arguments.out)
# a rank that exits with its process group alive can abort in gloo's teardown ("terminate called without an active
# exception"): the ranks leave together, the group destroyed
dist.barrier()
dist.destroy_process_group()
