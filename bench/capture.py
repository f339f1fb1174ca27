"""What ``nnterp.capture`` costs next to the forward it wraps, how its memory grows with the corpus, and its resume.

Throughput: the residual stream of every block (``layers[i].layer_output``) captured end to end, from the texts
(tokenizing and packing them) to the shards on disk (synced), against the plain transformers forward over the
same packed token batches, in tokens per second; interleaved repeats, medians. The shards are small enough that a
run writes several, as a capture of a corpus does, so writing overlaps compute but for the last shard. On two
models with random weights:

- deltanet: the trajectory benchmark's gated DeltaNet model (Qwen3.5's mixer, 16 heads x 128 x 128, hidden 1024,
  two mixer blocks and one softmax attention block);
- llama: a small Llama (hidden 256, 4 blocks, 8 heads).

Memory: the rise of the peak resident set (VmHWM) of a fresh process capturing every block's residual stream
of the small Llama over 100 and over 10,000 sequences, the shard size fixed (``--shard-mib``).

Resume: a capture in a process of its own, killed with SIGKILL after its third shard, then run again,
against an uninterrupted one: every file's sha256.

Remote: the size of a ten-value request on tiny models, carrying nnterp by value (for a server with only
nnsight, ``nnterp.remote.ship``) and by reference; tests/test_remote.py checks the values a server returns.

    python bench/capture.py [--threads 2] [--sequences 96] [--context 256] [--batch-size 8] [--repeats 3]
                            [--shard-mib 8] [--models deltanet llama]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import torch
from trajectory import FAMILIES

from nnterp.capture import capture
from nnterp.capture.shards import MANIFEST
from nnterp.capture.texts import batches, sequences
from nnterp.testing.tokenizer import CHARACTERS

MODELS = {
    "deltanet": (FAMILIES["deltanet"].model_type, FAMILIES["deltanet"].config, FAMILIES["deltanet"].load),
    "llama": (
        "llama",
        dict(
            vocab_size=1024,
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
        ),
        {},
    ),
}
MEMORY_ROWS = (100, 10_000)
MEMORY_CONTEXT = 32


def corpus(count: int, seed: int = 0) -> list[str]:
    """``count`` texts of random characters the local tokenizer knows, 200 to 2000 characters each."""
    draw = random.Random(seed)
    return ["".join(draw.choices(CHARACTERS, k=draw.randint(200, 2000))) for _ in range(count)]


def residuals(model) -> list[str]:
    return [f"layers[{i}].layer_output" for i in range(model.num_layers)]


def throughput(name: str, options: argparse.Namespace) -> None:
    model_type, config, load = MODELS[name]
    plain, traced = harness.twins(model_type, config, **load)
    model = harness.standardized(traced)
    texts = corpus(options.sequences * options.context // 500 + 10)
    rows = list(itertools.islice(sequences(texts, model.tokenizer, options.context, True), options.sequences))
    assert len(rows) == options.sequences, "the corpus is too short for --sequences"
    ids = [torch.tensor(batch) for batch in batches(iter(rows), options.batch_size)]
    values = residuals(model)
    out = Path(tempfile.mkdtemp(prefix="nnterp-capture-bench-"))

    def forward() -> None:
        with torch.no_grad():
            for batch in ids:
                plain(batch)

    def captured() -> None:
        shutil.rmtree(out, ignore_errors=True)
        capture(
            model,
            texts,
            values,
            out,
            context=options.context,
            batch_size=options.batch_size,
            max_sequences=options.sequences,
            shard_mib=options.shard_mib,
            progress=False,
        )

    runs = {"plain": forward, "capture": captured}
    times: dict[str, list[float]] = {run: [] for run in runs}
    for run in runs.values():
        run()
    for _ in range(options.repeats):
        for run_name, run in runs.items():
            start = time.perf_counter()
            run()
            times[run_name].append(time.perf_counter() - start)
    shutil.rmtree(out, ignore_errors=True)
    tokens = options.sequences * options.context
    rate = {run_name: tokens / statistics.median(spent) for run_name, spent in times.items()}
    print(
        f"{name}: {len(values)} residual streams, {options.sequences} x {options.context} tokens, batch "
        f"{options.batch_size}, {options.shard_mib} MiB shards: plain {rate['plain']:.0f} tok/s, capture {rate['capture']:.0f} tok/s, "
        f"capture/plain {rate['capture'] / rate['plain']:.2f}x (target at least 0.9x)"
    )


def peak(rows: int, shard_mib: float) -> tuple[float, float]:
    """In this process: the small Llama's every residual stream over ``rows`` sequences; MiB the peak resident set
    rose by during the capture, and the process's whole peak."""
    model_type, config, load = MODELS["llama"]
    (module,) = harness.twins(model_type, config, copies=1, **load)
    model = harness.standardized(module)
    texts = corpus(rows * MEMORY_CONTEXT // 1000 + 10)
    out = Path(tempfile.mkdtemp(prefix="nnterp-capture-peak-"))
    values = residuals(model)
    run = dict(context=MEMORY_CONTEXT, batch_size=16, shard_mib=shard_mib, progress=False)
    capture(model, texts, values, out / "warm", max_sequences=16, **run)
    rise = harness.peak_rise(lambda: capture(model, texts, values, out / "run", max_sequences=rows, **run))
    shutil.rmtree(out)
    return rise, harness.resident_peak()


def memory(options: argparse.Namespace) -> None:
    """The peak over ``MEMORY_ROWS`` sequences, the median of ``--repeats`` fresh processes each."""
    medians = {}
    for rows in MEMORY_ROWS:
        command = [sys.executable, __file__, "--peak", str(rows), "--threads", str(options.threads)]
        command += ["--shard-mib", str(options.shard_mib)]
        runs = [subprocess.run(command, check=True, capture_output=True, text=True) for _ in range(options.repeats)]
        readings = [tuple(map(float, run.stdout.split()[-2:])) for run in runs]
        medians[rows] = tuple(statistics.median(reading[i] for reading in readings) for i in range(2))
    (low_rise, low_peak), (high_rise, high_peak) = medians[MEMORY_ROWS[0]], medians[MEMORY_ROWS[-1]]
    print(
        f"memory: the small Llama's {MODELS['llama'][1]['num_hidden_layers']} residual streams, context "
        f"{MEMORY_CONTEXT}, {options.shard_mib} MiB shards, median of {options.repeats} fresh processes: "
        f"{MEMORY_ROWS[0]} sequences peak {low_peak:.0f} MiB (rise {low_rise:.0f} MiB), {MEMORY_ROWS[-1]} sequences "
        f"peak {high_peak:.0f} MiB (rise {high_rise:.0f} MiB): peak ratio {high_peak / low_peak:.2f}x "
        f"(target within 10%), rise ratio {high_rise / low_rise:.2f}x"
    )


#: A capture in a process of its own (model directory, output directory), as the resume check runs it twice.
RESUMED = """
import sys
from nnterp.capture import capture
texts = [f"text {i}: " + "abcdefghij" * (i % 7 + 1) for i in range(2000)]
capture(sys.argv[1], texts, ["layers[0].layer_output", "layers[3].layer_output"], sys.argv[2], context=64,
        batch_size=4, shard_mib=0.25, progress=False)
"""


def resume() -> None:
    from nnterp.testing import local_tokenizer

    model_type, config, load = MODELS["llama"]
    work = Path(tempfile.mkdtemp(prefix="nnterp-capture-resume-"))
    (module,) = harness.twins(model_type, config, copies=1, **load)
    module.save_pretrained(work / "model")
    local_tokenizer(config["vocab_size"]).save_pretrained(work / "model")

    def command(out: str) -> list[str]:
        return [sys.executable, "-c", RESUMED, str(work / "model"), str(work / out)]

    subprocess.run(command("whole"), check=True, capture_output=True)
    run = subprocess.Popen(command("killed"), stderr=subprocess.DEVNULL)
    manifest = work / "killed" / MANIFEST
    while run.poll() is None:
        if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 3:
            os.kill(run.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    run.wait()
    done = len(json.loads(manifest.read_text())["shards"])
    subprocess.run(command("killed"), check=True, capture_output=True)

    def hashes(out: str) -> dict[str, str]:
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted((work / out).iterdir())}

    whole = hashes("whole")
    print(
        f"resume: killed (SIGKILL) with {done} of {len(whole) - 1} shards written, run again: "
        f"{'identical' if hashes('killed') == whole else 'DIFFERENT'} files (sha256 of {len(whole)} files)"
    )
    shutil.rmtree(work)


def request_sizes() -> None:
    """Bytes of a ten-value remote request on each tiny model, carrying nnterp by value and by reference."""
    from nnsight.tracing.backend import Backend

    from nnterp import StandardizedTransformer
    from nnterp.remote import ship
    from nnterp.testing import save_tiny

    class Serialized(Backend):
        def __init__(self, model: StandardizedTransformer) -> None:
            self.remote = model._remote_backend(True, True, None, False)

        def __call__(self, tracer) -> None:
            self.blob = self.remote._serialize(tracer)

    work = Path(tempfile.mkdtemp(prefix="nnterp-capture-remote-"))
    for family in ("llama", "qwen3_next", "mamba2"):
        model = StandardizedTransformer(save_tiny(family, work / family))
        block = model.layers[0]
        names = [name for name, reason in model.support(layer=0).items() if reason is None][:10]
        places = [
            (getattr(block, name.rpartition(".")[0]) if "." in name else block, name.rpartition(".")[2])
            for name in names
        ]
        sizes = {}
        for how in ("value", "reference"):
            ship(how)
            backend = Serialized(model)
            with model.trace(backend=backend) as tracer:
                with tracer.invoke("The Eiffel Tower is in"):
                    pass
                for owner, value in places:
                    with tracer.invoke():
                        getattr(owner, value).save()
            sizes[how] = len(backend.blob)
        ship("auto")
        print(
            f"remote request, {family}, {len(names)} values ({'compressed' if backend.remote.compress else 'raw'}): "
            f"by value {sizes['value'] / 1024:.0f} KiB (target at most 256 KiB), by reference {sizes['reference'] / 1024:.1f} KiB"
        )
    shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=96)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--shard-mib", type=float, default=8, help="the shard size, so a run writes several")
    parser.add_argument("--peak", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    if options.peak is not None:
        print(*peak(options.peak, options.shard_mib))
        return
    print(f"nnterp.capture, {options.threads} thread(s)")
    for name in options.models:
        throughput(name, options)
    memory(options)
    resume()
    request_sizes()


if __name__ == "__main__":
    main()
