"""`llamaspec gpu-acceptance`: every GPU promise checked in one command, on an NVIDIA GPU.

CUDA builds of both engines at their default pins (each smoke-tested), the strict and
oracle tiers of verify, the ngram recipe and the tuned one benchmarked, and a short tune;
every report goes under --reports, and a summary names the GPU and the driver. Without a
visible NVIDIA GPU it stops before doing anything.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError
from llamaspec.paths import default_out

if TYPE_CHECKING:
    from rich.console import Console

ENGINES = ("llama.cpp", "ik_llama.cpp")
RECIPES = ("gemma3-270m-ngram", "gemma3-270m-ngram-tuned")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "cuda-compile-check",
        help="no GPU needed: configure CUDA and compile a few representative CUDA sources",
    )
    options.add(c, "engine", "pin", "source", "source_dir", "cuda_arch", "cuda_toolkit")
    options.add(c, "patch", "no_patch", "variants", "defines", "jobs")
    c.add_argument(
        "--out", type=shared.out_file, help="write the record (per-object seconds) as JSON"
    )
    g = sub.add_parser(
        "gpu-acceptance",
        help="on an NVIDIA GPU: build CUDA for both engines, smoke, verify, bench, tune",
    )
    options.add(g, "cuda_arch", "cuda_toolkit", "source", "variants", "jobs")
    g.add_argument("--dist", type=Path, default=default_out("dist"))
    g.add_argument("--reports", type=shared.out_dir, default=default_out("reports"))
    g.add_argument(
        "--engine", action="append", default=[], help="only these engines (default: both)"
    )
    g.add_argument(
        "--tune-budget", type=shared.minutes, default=5.0, help="minutes for tune (default 5)"
    )


def steps(args: argparse.Namespace, engine: str, aid: str) -> list[tuple[str, list[str]]]:
    """The commands after an engine's build, on its artifact (llamaspec argv)."""
    art = ["--artifact", aid, "--dist", str(args.dist), "--reports", str(args.reports)]
    out = [
        (f"{engine}: verify strict", ["verify", "--tier", "strict", *art]),
        (f"{engine}: verify oracle", ["verify", "--tier", "oracle", *art]),
    ]
    out += [(f"{engine}: bench {recipe}", ["bench", recipe, *art]) for recipe in RECIPES]
    budget = str(args.tune_budget)
    return [*out, (f"{engine}: tune", ["tune", RECIPES[0], "--budget", budget, *art])]


def kept_from(summary: Path, engines: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The rows and artifacts of an earlier summary for the engines not run now."""
    try:
        record = json.loads(summary.read_text())
        rows = [r for r in record["steps"] if r["step"].split(":")[0] not in engines]
        artifacts = {e: a for e, a in record["artifacts"].items() if e not in engines}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], {}  # none, or not one this code wrote: started afresh
    return rows, artifacts


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command == "cuda-compile-check":
        from llamaspec.engine.cuda import check as cuda_check

        record = cuda_check.run(options.build_spec(args, backend="cuda"), console)
        if args.out:
            args.out.write_text(json.dumps(record, indent=2) + "\n")
        return True
    if args.command != "gpu-acceptance":
        return False
    from llamaspec.cli.main import main
    from llamaspec.engine import backends, profiles
    from llamaspec.engine.artifact import newest_artifact
    from llamaspec.engine.cuda import host as gpuhost
    from llamaspec.errors import choose

    # what was asked for is checked before the GPU is looked for: a typo is named anywhere
    engines = [choose("engine", e, ENGINES) for e in args.engine] or list(ENGINES)
    if args.cuda_arch:
        backends.parse_cuda_arch(args.cuda_arch)
    for engine in engines:
        for variant in args.variant:
            profiles.variant_flags(engine, variant, "cuda")
    gpus = gpuhost.gpu_names()
    driver = gpuhost.driver_version()
    if not gpus:
        raise LlamaspecError(
            "gpu-acceptance needs an NVIDIA GPU, and none is visible here (`nvidia-smi` is "
            f"{'missing' if driver is None else 'listing no GPU'}); nothing was built. Run it "
            "on a machine with a GPU and its driver (docs/guides/cuda.md, 'CUDA: the GPU "
            "acceptance run', says what to carry to one without a network)."
        )
    args.reports.mkdir(parents=True, exist_ok=True)

    gpu_text = "; ".join(gpus)
    slug = gpus[0].split(",")[0].strip().lower().replace(" ", "-")
    out = args.reports / f"gpu-acceptance-{slug}"
    # a run of some engines keeps what an earlier run on this GPU proved for the others
    rows, artifacts = kept_from(out.with_suffix(".json"), engines)

    def summary() -> None:
        # rewritten after every step: a run cut short still says what it proved
        record = {"gpus": gpus, "driver": driver, "artifacts": artifacts, "steps": rows}
        out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        lines = [
            f"# GPU acceptance on {gpu_text}",
            "",
            f"Driver {driver}; artifacts: "
            + (", ".join(f"{e} `{a}`" for e, a in artifacts.items()) or "none built")
            + ". Each step's own report is beside this one.",
            "",
            "| step | exit | seconds | command |",
            "|---|---|---|---|",
            *(
                f"| {r['step']} | {r['exit']} | {r['seconds']:.0f} | "
                f"`llamaspec {' '.join(r['argv'])}` |"
                for r in rows
            ),
            "",
        ]
        out.with_suffix(".md").write_text("\n".join(lines))

    def run(name: str, argv: list[str]) -> bool:
        console.print(f"gpu-acceptance: {name}: llamaspec {' '.join(argv)}")
        t0 = time.monotonic()
        code = main(argv)
        rows.append({"step": name, "argv": argv, "exit": code, "seconds": time.monotonic() - t0})
        summary()
        return code == 0

    arch = args.cuda_arch or "native"
    build = ["build", "--backend", "cuda", "--cuda-arch", arch, "--dist", str(args.dist)]
    build += ["--cuda-toolkit", args.cuda_toolkit, "--source", args.source]
    build += [a for v in args.variant for a in ("--variant", v)]
    build += ["--jobs", str(args.jobs)] if args.jobs else []
    # engine by engine, each built then exercised: a run cut short has whole engines
    for engine in engines:
        if run(f"{engine}: build and smoke", [*build, "--engine", engine]):
            artifacts[engine] = newest_artifact(args.dist, engine)
            for name, argv in steps(args, engine, artifacts[engine]):
                run(name, argv)
    console.print(f"gpu-acceptance: summary in {out}.md")
    failed = [r["step"] for r in rows if r["exit"] != 0]
    if failed:
        raise LlamaspecError(
            f"gpu-acceptance: {len(failed)} of {len(rows)} steps failed ({', '.join(failed)}); "
            f"their output is above and the summary in {out}.md."
        )
    return True
