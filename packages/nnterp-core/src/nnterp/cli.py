"""The ``nnterp`` command: installed plugins, a model's support table, and the conformance check.

nnterp plugins              every plugin, its distribution, families and model types, and any that failed
nnterp support [MODEL]      the support table of MODEL (hub id or directory), or of every family's tiny model
nnterp check [--json] [FAMILY ...]
                            the conformance suites on each family's tiny model; exits 1 on any failure
nnterp capture MODEL OUT --value VALUE [--value ...] (--texts FILE ... | --dataset NAME [--split SPLIT])
                            standard values over a corpus, into sharded safetensors (nnterp.capture); run again
                            to resume
nnterp coverage [--json | --markdown] [--check [generic]]
                            which of the installed transformers' causal LMs a family serves, and the recurrent
                            ones none does; --check runs the suites of the families that serve them,
                            --check generic only those of the types a generic family serves
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
import unittest
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from tqdm import tqdm

from . import compatibility
from .components.declaration import forward_changes
from .family import declared
from .registry import REGISTRY, PluginError, family_name


def plugins(out: TextIO) -> int:
    """Print every plugin with its distribution and version, its families and their model types."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        infos = REGISTRY.plugins()
    for info in infos:
        origin = f"{info.distribution} {info.version}" if info.distribution else "registered directly"
        print(f"{info.name} ({origin})", file=out)
        for family in info.families:
            print(f"  {family_name(family)}: {', '.join(family.MODEL_TYPES)}", file=out)
    for name in REGISTRY.generic_plugins():
        print(
            f"{name} also serves, with a generic family, a model type no family names whose blocks it recognizes",
            file=out,
        )
    for failure in REGISTRY.failures:
        print(f"{failure.name} ({failure.distribution} {failure.version}) FAILED to load: {failure.error}", file=out)
    if not any(info.families for info in infos) and not REGISTRY.failures:
        print("no nnterp plugins installed; pip install nnterp-attention (or another nnterp plugin)", file=out)
    return 0


def _support_lines(model: Any) -> list[str]:
    tables = [("", model.support())]
    vision = getattr(model, "vision", None)
    if vision is not None:
        tables.append(("vision.", vision.support()))
    lines = []
    for prefix, table in tables:
        for name, reason in table.items():
            if reason is None:
                lines.append(f"  {prefix}{name}: available")
            elif isinstance(reason, str):
                lines.append(f"  {prefix}{name}: {reason}")
            else:
                for layer, why in reason.items():
                    lines.append(f"  {prefix}{name} [layer {layer}]: {why}")
    return lines


def tiny_of(family: ModuleType) -> Any:
    """The tiny model a family is shown and checked on: a vision family's with its processor."""
    from .components.vision import vision_family
    from .testing import tiny_standardized
    from .testing.vision import tiny_vision_standardized

    if vision_family(family) and not declared(family).NO_IMAGES:
        return tiny_vision_standardized(family)
    return tiny_standardized(family)


def support(out: TextIO, model_id: str | None) -> int:
    """Print which standard values a model has: MODEL's, or every installed family's tiny model's."""
    from .transformer import StandardizedTransformer

    if model_id is not None:
        model = StandardizedTransformer(model_id)
        served = f"generic family: {model.generic}" if model.generic else f"family {family_name(model.family)}"
        print(f"{model_id} ({served})", file=out)
        print("\n".join(_support_lines(model)), file=out)
        return 0
    for name, family in sorted(REGISTRY.families().items()):
        print(f"{name} (tiny {family.MODEL_TYPES[0]})", file=out)
        print("\n".join(_support_lines(tiny_of(family))), file=out)
    return 0


#: unittest's names for a suite's class fixtures, as the suites spell them.
CLASS_FIXTURES = {"setUpClass": "setup_class", "tearDownClass": "teardown_class"}


class CountingResult(unittest.TestResult):
    """unittest's result for one family's suite, advancing a progress bar after each test."""

    def __init__(self, bar: tqdm) -> None:
        super().__init__()
        self.bar = bar
        self.passed = 0

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed += 1

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.bar.update()

    @property
    def problems(self) -> list[tuple[str, str]]:
        """Each failure and error as (test, traceback); a class fixture that raised is one, named as the suite
        spells it (``setup_class``)."""
        return [
            (
                test._testMethodName
                if isinstance(test, unittest.TestCase)
                else CLASS_FIXTURES.get(test.description.split()[0], test.description),
                error,
            )
            for test, error in self.errors + self.failures
        ]


def run_suite(suite: type, out: TextIO, label: str) -> CountingResult:
    """Run a suite class with unittest, a tqdm bar on ``out`` while it runs when ``out`` is a terminal."""
    from .testing.assembly import as_test_case

    tests = unittest.defaultTestLoader.loadTestsFromTestCase(as_test_case(suite))
    with tqdm(total=tests.countTestCases(), desc=label, file=out, disable=not out.isatty(), leave=False) as bar:
        result = CountingResult(bar)
        tests.run(result)
    return result


def check(out: TextIO, names: list[str], as_json: bool = False) -> int:
    """Run the conformance suites on each named family's tiny model (every installed one by default); 1 on a failure.

    With ``as_json`` the lines go to stderr and ``out`` gets one object: the installed transformers, the verified
    range, plugins that failed to load, and per family its counts and each failing test's traceback.
    """
    compatibility.warn_if_unverified()
    families = (
        [REGISTRY.family(name) for name in names] if names else [f for _, f in sorted(REGISTRY.families().items())]
    )
    if not as_json:
        return check_families(out, families)
    results: list[dict[str, Any]] = []
    code = check_families(sys.stderr, families, results)
    failures = [dataclasses.asdict(failure) for failure in REGISTRY.failures]
    json.dump(compatibility.status() | {"plugin_failures": failures, "families": results}, out, indent=1)
    out.write("\n")
    return code


def check_families(out: TextIO, families: list[ModuleType], results: list[dict[str, Any]] | None = None) -> int:
    """Run the conformance suites on each family's tiny model, a line per family; 1 on any failure.

    ``results``, when given, gets a dict per family: its name, plugin, model types, counts and failures.
    """
    from transformers.utils import logging

    from .testing.assembly import suite_for

    logging.disable_progress_bar()
    logging.set_verbosity_error()  # transformers' notes that it runs its pure-torch kernels: that is the point here
    width = max((len(family_name(f)) for f in families), default=0)
    failed = False
    for family in families:
        label = family_name(family).ljust(width)
        changes = forward_changes(family)
        if changes:
            # its recurrent values are all unavailable, with the reason: running its suites would say it 36 times
            out.write(f"{label} FAILED: forward changed in transformers {transformers_version()}\n")
            out.write("".join(f"  {change}\n" for change in changes))
            failed = True
            if results is not None:
                results.append(_result(family, 0, 0, [], changes))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                suite = suite_for(family)
            except Exception:
                passed, skipped, failures = 0, 0, [("assembling the suites", traceback.format_exc(limit=-3))]
            else:
                result = run_suite(suite, out, label)
                passed, skipped, failures = result.passed, len(result.skipped), result.problems
        verdict = "ok" if not failures else "FAILED"
        out.write(f"{label} {verdict}: {passed} passed, {len(failures)} failed, {skipped} skipped\n")
        for test, error in failures:
            out.write(f"  {test}:\n    " + error.strip().replace("\n", "\n    ") + "\n")
        failed = failed or bool(failures)
        if results is not None:
            results.append(_result(family, passed, skipped, failures, []))
    return 1 if failed else 0


def _result(
    family: ModuleType, passed: int, skipped: int, failures: list[tuple[str, str]], changes: list[str]
) -> dict[str, Any]:
    """A family's entry in ``nnterp check --json``: its counts and failures, or how its forward changed."""
    name = family_name(family)
    return {
        "family": name,
        "plugin": REGISTRY.index["owners"].get(name),
        "model_types": list(family.MODEL_TYPES),
        "passed": passed,
        "failed": len(failures) + len(changes),
        "skipped": skipped,
        "failures": [{"test": test, "error": error} for test, error in failures],
        "forward_changed": changes,
    }


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def coverage(out: TextIO, as_json: bool, run_checks: str | None, as_markdown: bool = False) -> int:
    """Print the census, a line per causal-LM model type and a summary (``as_markdown``: the README's tables, the
    types by status and the recurrent mixer kinds); with ``run_checks``, then check every
    family serving one on its tiny model (exit 1 on a failure): ``"all"``, named or generic, or ``"generic"``, only
    the generic families, where a named family's suites already run in its package's tests (as in CI)."""
    from .census import coverage as census
    from .census import family_of, markdown

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a plugin that fails to import is reported by `nnterp plugins`
        rows = census()
    if as_json:
        json.dump([dataclasses.asdict(row) | {"served": row.served} for row in rows], out, indent=1)
        out.write("\n")
    elif as_markdown:
        out.write(markdown(rows))
    else:
        width = max(len(row.model_type) for row in rows)
        for row in rows:
            if row.generic:
                where = f"served by {row.plugin}: generic ({row.generic})"
            elif row.served:
                where = f"served by {row.plugin}: {row.family}"
            elif row.partly:
                where = f"partly served: its {', '.join(row.partly)} layers are; not served whole: {row.reason}"
            else:
                where = f"not served: {row.reason}"
            kernels = f" (recurrent: {', '.join(row.recurrent_kernels)})" if row.recurrent_kernels else ""
            lost = "; NO FAMILY SERVES ITS RECURRENT KERNEL" if row.recurrent_kernels and not row.served else ""
            print(f"{row.model_type.ljust(width)}  {where}{kernels}{lost}", file=out)
        recurrent = [row for row in rows if row.recurrent_kernels]
        generic = sum(bool(row.generic) for row in rows)
        print(
            f"{sum(row.served for row in rows)} of {len(rows)} causal-LM model types served "
            f"({generic} by a generic family); {sum(row.served for row in recurrent)} of the {len(recurrent)} "
            f"with a recurrent kernel",
            file=out,
        )
    if not run_checks:
        return 0
    families: dict[int, ModuleType] = {}
    for row in rows:
        if row.served and (run_checks == "all" or row.generic):
            family = family_of(row.model_type)
            families.setdefault(id(family), family)
    return check_families(sys.stderr if as_json else out, list(families.values()))


def capture(out: TextIO, args: argparse.Namespace) -> int:
    """Run ``nnterp.capture.capture`` with the command's arguments, and print what it wrote."""
    from .capture import capture as run_capture

    written = run_capture(
        args.model,
        [Path(path) for path in args.texts] if args.texts else args.dataset,
        args.value,
        args.out,
        context=args.context,
        batch_size=args.batch_size,
        pack=not args.no_pack,
        text_column=args.text_column,
        split=args.split,
        max_sequences=args.max_sequences,
        shard_mib=args.shard_mib,
    )
    tokens = sum(shard["tokens"] for shard in written.shards)
    print(f"{len(written)} sequences, {tokens} tokens, {len(written.shards)} shards in {args.out}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nnterp", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("plugins", help="list installed plugins, their families and model types, and failures")
    support_parser = commands.add_parser("support", help="which standard values a model has")
    support_parser.add_argument(
        "model", nargs="?", help="hub id or local directory (default: every family's tiny model)"
    )
    check_parser = commands.add_parser("check", help="run the conformance suites on each family's tiny model, offline")
    check_parser.add_argument("families", nargs="*", help="family names (default: every installed family)")
    check_parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (transformers version, verified range, per family its counts and failures) "
        "and the usual lines on stderr",
    )
    coverage_parser = commands.add_parser(
        "coverage", help="which causal LMs of the installed transformers a family serves, offline"
    )
    coverage_format = coverage_parser.add_mutually_exclusive_group()
    coverage_format.add_argument("--json", action="store_true", help="one object per model type, for machines")
    coverage_format.add_argument(
        "--markdown", action="store_true", help="the README's tables: the types by status, the recurrent mixer kinds"
    )
    coverage_parser.add_argument(
        "--check",
        nargs="?",
        const="all",
        choices=("all", "generic"),
        help="then run the suites of every family that serves one (`generic`: only of the generic families)",
    )
    capture_parser = commands.add_parser("capture", help="capture standard values over a corpus into a directory")
    capture_parser.add_argument("model", help="hub id or local directory")
    capture_parser.add_argument("out", help="the capture's directory; a capture there with the same arguments resumes")
    capture_parser.add_argument(
        "--value",
        action="append",
        required=True,
        help="a standard name, with options as the manifest spells them: 'layers[4].linear_attn.states(positions=-1)'",
    )
    source = capture_parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--texts", nargs="+", help="text files: .txt (one text each) or .jsonl (one record a line)")
    source.add_argument("--dataset", help="a datasets dataset's name, streamed")
    capture_parser.add_argument("--split", default="train")
    capture_parser.add_argument("--text-column", default="text")
    capture_parser.add_argument("--context", type=int, default=128)
    capture_parser.add_argument("--batch-size", type=int, default=8)
    capture_parser.add_argument("--no-pack", action="store_true", help="one sequence per text instead of packing")
    capture_parser.add_argument("--max-sequences", type=int)
    capture_parser.add_argument("--shard-mib", type=float, default=256)
    args = parser.parse_args(argv)
    try:
        if args.command == "capture":
            return capture(sys.stdout, args)
        if args.command == "plugins":
            return plugins(sys.stdout)
        if args.command == "support":
            return support(sys.stdout, args.model)
        if args.command == "coverage":
            return coverage(sys.stdout, args.json, args.check, args.markdown)
        return check(sys.stdout, args.families, args.json)
    except (PluginError, ValueError) as error:
        print(f"nnterp {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
