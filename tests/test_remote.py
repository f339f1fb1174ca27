"""A StandardizedTransformer's trace, serialized as a remote request, runs on a server hosting the plain checkpoint.

No network: the client serializes each request as nnsight's remote backend
does (``model._remote_backend``), and a fresh Python process, standing in for
an NDIF server, builds a plain ``TransformersModel`` from the request's model
key, deserializes the request against it and runs it. Every value ``support()``
lists for a block of each plugin's first family, and a write, come back equal
to a local run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from nnsight.modeling.transformers import TransformersModel
from nnsight.tracing.backend import Backend

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, save_tiny

FAMILIES = ("llama", "qwen3_next", "mamba", "mamba2")

#: The server: a fresh process with a plain model built from the key, running each request it is handed.
SERVER = textwrap.dedent(
    """
    import sys, torch
    from nnsight.modeling.transformers import TransformersModel
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.tracer import dec, inc

    key, requests, compressed = sys.argv[1], torch.load(sys.argv[2]), sys.argv[4] == "True"
    assert "nnterp" not in sys.modules, "the server imported nnterp before any request"
    server = TransformersModel.from_model_key(key, task="text-generation", dispatch=True)
    objects = server._remoteable_persistent_objects()
    results = {}
    for name, blob in requests.items():
        tracer = RequestModel.deserialize(blob, objects, compress=compressed)
        inc()
        try:
            tracer.execute(tracer.info.code)
        finally:
            dec()
        results[name] = tracer.info.frame.f_locals["result"]
    torch.save(results, sys.argv[3])
    """
)


class Capture(Backend):
    """Serializes the trace as the remote backend would send it, and runs nothing."""

    def __init__(self, model: StandardizedTransformer) -> None:
        self.remote = model._remote_backend(True, True, None, False)
        self.blob: bytes | None = None

    def __call__(self, tracer) -> None:
        self.blob = self.remote._serialize(tracer)


def read(model: StandardizedTransformer, owner: str, value: str, layer: int, backend: Backend | None = None):
    block = model.layers[layer]
    with model.trace(PROMPT, backend=backend):
        result = getattr(getattr(block, owner) if owner else block, value).save()
    return None if backend is not None else result


def write(model: StandardizedTransformer, backend: Backend | None = None):
    with model.trace(PROMPT, backend=backend):
        model.layers[1].layer_input[:] = 0
        result = model.logits.save()
    return None if backend is not None else result


@pytest.mark.parametrize("family", FAMILIES)
def test_every_value_and_a_write_run_on_a_plain_server(family, tmp_path):
    directory = save_tiny(family, str(tmp_path / family))
    model = StandardizedTransformer(directory)
    key = model._remote_backend(True, True, None, False).model_key
    assert key.startswith("nnsight.modeling.transformers.TransformersModel:")
    requests, expected = {}, {}
    for layer in range(model.num_layers):
        for name, reason in model.support(layer=layer).items():
            if reason is not None:
                continue
            owner, _, value = name.rpartition(".")
            capture = Capture(model)
            read(model, owner, value, layer, capture)
            requests[f"{layer}.{name}"] = capture.blob
            expected[f"{layer}.{name}"] = read(model, owner, value, layer)
    capture = Capture(model)
    write(model, capture)
    requests["write"], expected["write"] = capture.blob, write(model)
    torch.save(requests, tmp_path / "requests.pt")
    server = subprocess.run(
        [sys.executable, "-c", SERVER, key, *(str(tmp_path / f"{kind}.pt") for kind in ("requests", "results"))]
        + [str(capture.remote.compress)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert server.returncode == 0, server.stderr[-3000:]
    results = torch.load(tmp_path / "results.pt")
    assert results.keys() == expected.keys()
    for name, value in expected.items():
        if value is None:
            assert results[name] is None, name
        else:
            close(results[name], value, what=f"{family} {name} from the server")
    with model.trace(PROMPT):
        unwritten = model.logits.save()
    assert not torch.allclose(unwritten, expected["write"]), "the write changed nothing"


def test_a_request_names_the_plain_deployment_and_carries_no_nnterp_source(tmp_path):
    directory = save_tiny("llama", str(tmp_path / "llama"))
    model = StandardizedTransformer(directory)
    plain_class = model._remoteable_class()
    assert plain_class is TransformersModel
    capture = Capture(model)
    read(model, "self_attn", "attention_probabilities", 0, capture)
    payload = capture.blob
    if capture.remote.compress:
        import zstandard

        payload = zstandard.ZstdDecompressor().decompress(payload)
    assert b"nnterp.transformer" in payload, "the wrapper's class is not named for the server to import"
    assert b"def layer_output" not in payload and b"EProperty(" not in payload, "nnterp's source was shipped"
