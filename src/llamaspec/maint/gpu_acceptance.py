"""`llamaspec gpu-acceptance`: every GPU promise checked in one run, on an NVIDIA GPU.

CUDA builds of both engines at their default pins (each smoke-tested), the strict and
oracle tiers of verify, a re-check of each open finding (proof.defects.OPEN_FINDINGS) as it
was seen, the ngram recipe and the tuned one benchmarked, the speculation ceiling swept
(`limit`, on engines with synthetic acceptance) with those bench reports set against it,
and a short tune;
every report goes under the reports directory, and a summary names the GPU and the driver.
Without a visible NVIDIA GPU it stops before doing anything.

Each step is its own `llamaspec` process (`python -m llamaspec.cli ...`), with this one's
stdout and stderr; its exit status is the step's.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec import procs
from llamaspec.engine.build import BUILD_TIMEOUT_S
from llamaspec.errors import LlamaspecError, choose
from llamaspec.proof.defects import open_findings

if TYPE_CHECKING:
    from rich.console import Console

ENGINES = ("llama.cpp", "ik_llama.cpp")
RECIPES = ("gemma3-270m-ngram", "gemma3-270m-ngram-tuned")
STEP_TIMEOUT_S = 3 * BUILD_TIMEOUT_S  # one step; a CUDA build and its smoke test are long
TIMED_OUT = 124  # a step's exit status when it was stopped at STEP_TIMEOUT_S
# Engines whose default pin has synthetic acceptance (`llamaspec limit` sweeps it).
SYNTHETIC = ("llama.cpp",)


@dataclass(frozen=True)
class Request:
    """What a GPU acceptance run builds and exercises (the `gpu-acceptance` options)."""

    engines: tuple[str, ...] = ()  # default: both
    dist: Path = field(default_factory=lambda: Path("dist"))
    reports: Path = field(default_factory=lambda: Path("reports"))
    cuda_arch: str | None = None  # default: native
    cuda_toolkit: str = "auto"
    source: str = "auto"
    variants: tuple[str, ...] = ()
    jobs: int | None = None
    tune_budget: float = 5.0  # minutes


def steps(request: Request, engine: str, aid: str) -> list[tuple[str, list[str]]]:
    """The commands after an engine's build, on its artifact (llamaspec argv)."""
    art = ["--artifact", aid, "--dist", str(request.dist), "--reports", str(request.reports)]
    out = [
        (f"{engine}: verify strict", ["verify", "--tier", "strict", *art]),
        (f"{engine}: verify oracle", ["verify", "--tier", "oracle", *art]),
    ]
    # each open finding of this engine on CUDA, re-checked as it was seen; its reports go
    # to a folder of their own (the full oracle step above writes the same file names)
    for f in open_findings(engine, "cuda"):
        where = ["--dist", str(request.dist), "--reports", str(request.reports / f.id)]
        out.append((f"{engine}: re-check {f.id}", [*f.check, "--artifact", aid, *where]))
    out += [(f"{engine}: bench {recipe}", ["bench", recipe, *art]) for recipe in RECIPES]
    if engine in SYNTHETIC:
        # the speculation ceiling, with the two bench reports just written set against it
        benches = [str(request.reports / f"bench-{recipe}-{aid}.json") for recipe in RECIPES]
        out.append((f"{engine}: limit", ["limit", *art, *_each("--bench", benches)]))
    budget = str(request.tune_budget)
    return [*out, (f"{engine}: tune", ["tune", RECIPES[0], "--budget", budget, *art])]


def _each(flag: str, values: list[str]) -> list[str]:
    return [a for v in values for a in (flag, v)]


def kept_from(summary: Path, engines: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The rows and artifacts of an earlier summary for the engines not run now."""
    try:
        record = json.loads(summary.read_text())
        rows = [r for r in record["steps"] if r["step"].split(":")[0] not in engines]
        artifacts = {e: a for e, a in record["artifacts"].items() if e not in engines}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], {}  # none, or not one this code wrote: started afresh
    return rows, artifacts


def step(argv: list[str], console: Console) -> int:
    """Run `llamaspec ARGV` as a child process; its exit status (TIMED_OUT when stopped)."""
    sys.stdout.flush()  # what this process printed comes before the child's output
    sys.stderr.flush()
    cmd = [sys.executable, "-m", "llamaspec.cli", *argv]
    try:
        proc = procs.run(
            cmd, timeout=STEP_TIMEOUT_S, capture=False, check=False, what=f"llamaspec {argv[0]}"
        )
    except LlamaspecError as exc:  # stopped at the time limit: a failed step, the run goes on
        from rich.markup import escape

        console.print(f"gpu-acceptance: {escape(exc.message)}")
        return TIMED_OUT
    return proc.returncode


def run(request: Request, console: Console) -> Path:
    """Build, smoke, verify, bench and tune on this GPU; the summary's path (without suffix).

    Raises when there is no GPU (before anything is built) or when any step failed (after
    all ran)."""
    from llamaspec.engine import backends, profiles
    from llamaspec.engine.artifact import newest_artifact
    from llamaspec.engine.cuda import host as gpuhost

    # what was asked for is checked before the GPU is looked for: a typo is named anywhere
    engines = [choose("engine", e, ENGINES) for e in request.engines] or list(ENGINES)
    if request.cuda_arch:
        backends.parse_cuda_arch(request.cuda_arch)
    for engine in engines:
        for variant in request.variants:
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
    request.reports.mkdir(parents=True, exist_ok=True)

    gpu_text = "; ".join(gpus)
    slug = gpus[0].split(",")[0].strip().lower().replace(" ", "-")
    out = request.reports / f"gpu-acceptance-{slug}"
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

    def run_step(name: str, argv: list[str]) -> bool:
        console.print(f"gpu-acceptance: {name}: llamaspec {' '.join(argv)}")
        t0 = time.monotonic()
        code = step(argv, console)
        rows.append({"step": name, "argv": argv, "exit": code, "seconds": time.monotonic() - t0})
        summary()
        return code == 0

    arch = request.cuda_arch or "native"
    build = ["build", "--backend", "cuda", "--cuda-arch", arch, "--dist", str(request.dist)]
    build += ["--cuda-toolkit", request.cuda_toolkit, "--source", request.source]
    build += [a for v in request.variants for a in ("--variant", v)]
    build += ["--jobs", str(request.jobs)] if request.jobs else []
    # engine by engine, each built then exercised: a run cut short has whole engines
    for engine in engines:
        if run_step(f"{engine}: build and smoke", [*build, "--engine", engine]):
            artifacts[engine] = newest_artifact(request.dist, engine)
            for name, argv in steps(request, engine, artifacts[engine]):
                run_step(name, argv)
    console.print(f"gpu-acceptance: summary in {out}.md")
    failed = [r["step"] for r in rows if r["exit"] != 0]
    if failed:
        raise LlamaspecError(
            f"gpu-acceptance: {len(failed)} of {len(rows)} steps failed ({', '.join(failed)}); "
            f"their output is above and the summary in {out}.md."
        )
    return out
