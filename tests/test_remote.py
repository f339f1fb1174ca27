"""A StandardizedTransformer's trace, serialized as a remote request, runs on a server hosting the plain checkpoint.

No network: the client serializes each request as nnsight's remote backend
does (``model._remote_backend``), and a fresh Python process, standing in for
an NDIF server, builds a plain ``TransformersModel`` from the request's model
key, deserializes the request against it and runs it. Every value ``support()``
lists for a block of each plugin's first family, and a write, come back equal
to a local run: by reference, on a server that has nnterp installed, and by
value, on one where neither nnterp's packages nor their libraries import.
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
from nnterp.remote import DEPENDENCIES, ship
from nnterp.testing import PROMPT, close, save_tiny

FAMILIES = ("llama", "qwen3_next", "mamba", "mamba2")
#: What a server with only nnsight lacks, when a request carries nnterp by value.
ABSENT = {"reference": [], "value": ["nnterp", *DEPENDENCIES]}


@pytest.fixture(params=("reference", "value"))
def shipping(request):
    ship(request.param)
    yield request.param
    ship("auto")


def serve(key: str, requests: dict, compress: bool, absent: list[str], directory) -> dict:
    """Run ``requests`` in a fresh process standing in for the server, lacking the packages ``absent`` names."""
    torch.save(requests, directory / "requests.pt")
    server = subprocess.run(
        [sys.executable, "-c", SERVER, key, str(directory / "requests.pt"), str(directory / "results.pt")]
        + [str(compress), *absent],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert server.returncode == 0, server.stderr[-3000:]
    return torch.load(directory / "results.pt")


#: The server: a fresh process with a plain model built from the key, running each request it is handed.
SERVER = textwrap.dedent(
    """
    import importlib.abc, sys, torch
    from nnsight.modeling.transformers import TransformersModel
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.tracer import dec, inc

    key, requests, compressed, blocked = sys.argv[1], torch.load(sys.argv[2]), sys.argv[4] == "True", sys.argv[5:]

    class Absent(importlib.abc.MetaPathFinder):
        # What a server with only nnsight has of the packages named on the command line: nothing.

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0].startswith(tuple(blocked)):
                raise ModuleNotFoundError(f"No module named {name!r} on this server")

    if blocked:
        sys.meta_path.insert(0, Absent())
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

    def payload(self) -> bytes:
        """The request's pickle, decompressed as the server reads it."""
        if not self.remote.compress:
            return self.blob
        import zstandard

        return zstandard.ZstdDecompressor().decompress(self.blob)


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
def test_every_value_and_a_write_run_on_a_plain_server(family, shipping, tmp_path):
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
    results = serve(key, requests, capture.remote.compress, ABSENT[shipping], tmp_path)
    assert results.keys() == expected.keys()
    for name, value in expected.items():
        if value is None:
            assert results[name] is None, name
        else:
            close(results[name], value, what=f"{family} {name} from the server, by {shipping}")
    with model.trace(PROMPT):
        unwritten = model.logits.save()
    assert not torch.allclose(unwritten, expected["write"]), "the write changed nothing"


@pytest.mark.parametrize("family", ("llama", "qwen3_next"))
def test_a_ten_value_request_by_value_is_at_most_256_kib(family, tmp_path):
    model = StandardizedTransformer(save_tiny(family, str(tmp_path / family)))
    names = [name for name, reason in model.support(layer=0).items() if reason is None][:10]
    assert len(names) == 10

    block = model.layers[0]
    places = [
        (getattr(block, name.rpartition(".")[0]) if "." in name else block, name.rpartition(".")[2]) for name in names
    ]

    def ten(backend: Backend | None = None):
        result = []
        with model.trace(backend=backend) as tracer:
            with tracer.invoke(PROMPT):
                pass
            for owner, value in places:
                with tracer.invoke():  # an invoke each: support() lists values in no particular forward order
                    result.append(getattr(owner, value).save())
        return None if backend is not None else result

    ship("value")
    try:
        capture = Capture(model)
        ten(capture)
    finally:
        ship("auto")
    assert len(capture.blob) <= 256 * 1024, f"a ten-value request by value is {len(capture.blob)} bytes"
    key = capture.remote.model_key
    results = serve(key, {"ten": capture.blob}, capture.remote.compress, ABSENT["value"], tmp_path)
    for name, mine, theirs in zip(names, ten(), results["ten"], strict=True):
        close(theirs, mine, what=f"{family} {name} from the server")


@pytest.mark.parametrize(
    "server, carried",
    [
        ({"nnterp": "same", "nnterp_attention": "same"}, False),
        ({"nnterp": "0.0.1", "nnterp_attention": "same"}, True),
        ({"nnterp": "same"}, True),
        (None, True),
    ],
)
def test_auto_ships_by_value_unless_the_server_has_our_packages_at_our_versions(tmp_path, monkeypatch, server, carried):
    from importlib.metadata import version

    import nnsight.ndif

    def remote_env(force_refresh: bool = False) -> dict:
        if server is None:
            raise ConnectionError("NDIF did not answer")
        mine = {"nnterp": version("nnterp-core"), "nnterp_attention": version("nnterp-attention")}
        return {"packages": {name: mine[name] if got == "same" else got for name, got in server.items()}}

    monkeypatch.setattr(nnsight.ndif, "get_remote_env", remote_env)
    model = StandardizedTransformer(save_tiny("llama", str(tmp_path / "llama")))
    capture = Capture(model)
    read(model, "", "layer_output", 0, capture)
    payload = capture.payload()
    assert (b"def shipped" in payload) == carried, (
        "the request carried nnterp by value" if not carried else "it did not"
    )


def test_a_request_names_the_plain_deployment_and_carries_no_nnterp_source(tmp_path):
    directory = save_tiny("llama", str(tmp_path / "llama"))
    model = StandardizedTransformer(directory)
    plain_class = model._remoteable_class()
    assert plain_class is TransformersModel
    capture = Capture(model)
    read(model, "self_attn", "attention_probabilities", 0, capture)
    payload = capture.payload()
    assert b"nnterp.transformer" in payload, "the wrapper's class is not named for the server to import"
    assert b"def layer_output" not in payload and b"EProperty(" not in payload, "nnterp's source was shipped"
