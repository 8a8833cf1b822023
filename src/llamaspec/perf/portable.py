"""`llamaspec bench-portable`: where a portable build runs, and what portability costs.

Two builds of the same pin are compared: a `portable` one (GGML_NATIVE=OFF; upstream picks
one CPU backend per instruction set at run time) and a native one (GGML_NATIVE=ON, tuned
for this machine). First both are started under an emulated older x86-64 CPU (qemu-user,
`-cpu Nehalem` by default: SSE4.2, no AVX) and asked for a completion; the AVX/AVX-512
instructions each file holds are counted (objdump). Then both serve the same request on
this CPU without emulation, alternating, and their tokens/s are compared. Report:
reports/portable-<artifact>.{json,md}.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.console import Console

from llamaspec.engine import backends
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models.embedded import embedded_model
from llamaspec.perf.bench import request
from llamaspec.runtime.client import Server, base_args, running, tail

DEFAULT_CPU = "Nehalem"  # 2008: SSE4.2, no AVX (x86-64-v2)
EMULATED_READY_S = 900  # an emulated start is slow: the model is read through the emulator
_LOADED = re.compile(r"loaded CPU backend from (\S+)")
# AVX and AVX-512 instructions name ymm/zmm registers (or AVX-512 mask registers)
_WIDE = re.compile(r"%[yz]mm\d|%k[1-7]\b")
PROMPT = (
    "Write a short, careful explanation of how a hash table handles collisions, covering "
    "separate chaining and open addressing, with the costs of each. "
) * 6


def qemu(cpu: str = "") -> str:
    """qemu-user's x86-64 emulator, or a clear error (naming the CPU model `cpu` asked for)."""
    exe = shutil.which("qemu-x86_64")
    if not exe:
        asked = f" (here as CPU model {cpu!r})" if cpu else ""
        raise LlamaspecError(
            "bench-portable runs the builds under an emulated older CPU with qemu-user's "
            f"qemu-x86_64{asked}, which is not installed. Install it (Debian/Ubuntu: `sudo "
            "apt-get install qemu-user`) and run the command again."
        )
    return exe


def cpu_model(name: str) -> str:
    """A qemu CPU model name, checked against `qemu-x86_64 -cpu help`."""
    if not name.strip():
        raise LlamaspecError(
            f"--cpu {name!r} names no CPU model. Pick one of `qemu-x86_64 -cpu help`, e.g. "
            "Nehalem (SSE4.2, no AVX), SandyBridge (AVX, no AVX2) or Haswell (AVX2)."
        )
    out = subprocess.run([qemu(name), "-cpu", "help"], capture_output=True, text=True, timeout=60)
    known = set(re.findall(r"^x86\s+(\S+)", out.stdout, re.M))
    if name not in known:
        raise LlamaspecError(
            f"qemu-x86_64 has no CPU model {name!r}. Pick one of `qemu-x86_64 -cpu help`, "
            "e.g. Nehalem (SSE4.2, no AVX), SandyBridge (AVX, no AVX2) or Haswell (AVX2)."
        )
    return name


def wide_instructions(files: Iterable[Path]) -> dict[str, int]:
    """Per ELF file: how many instructions use AVX (ymm) or AVX-512 (zmm, k) registers."""
    out: dict[str, int] = {}
    for path in files:
        proc = subprocess.Popen(
            ["objdump", "-d", "--no-show-raw-insn", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        out[path.name] = sum(1 for line in proc.stdout if _WIDE.search(line))
        proc.wait()
    return out


def elf_files(artifact: Artifact) -> list[Path]:
    """llama-server and every shared library of the artifact (CPU modules included)."""
    found = [artifact.server, *artifact.path.glob("bin/*.so"), *artifact.path.glob("lib/*.so*")]
    return sorted({p.resolve() for p in found if p.is_file() and not p.is_symlink()})


def emulated_run(artifact: Artifact, model: Path, cpu: str, logs: Path) -> dict:
    """Start the server under `qemu-x86_64 -cpu CPU` and ask for a short completion."""
    log = logs / f"emulated-{artifact.id}.log"
    t0 = time.monotonic()
    out: dict = {"cpu": cpu}
    try:
        with running(
            artifact.server,
            [*base_args(model, ctx=512), "-t", "2", "-lv", "4"],
            log,
            ready_timeout=EMULATED_READY_S,
            prefix=[qemu(), "-cpu", cpu],
        ) as srv:
            reply = srv.post("/completion", request("The capital of France is", 8), 900)
        out.update(answered=True, text=reply.get("content", ""))
    except LlamaspecError as exc:
        # the message without the command line, which names paths of this machine
        out.update(answered=False, error=exc.message.split(". Command:")[0], log_tail=tail(log, 4))
    text = log.read_text(errors="replace") if log.is_file() else ""
    loaded = _LOADED.findall(text)
    out["cpu_backend"] = Path(loaded[-1]).name if loaded else None
    out["illegal_instruction"] = "Illegal instruction" in text or "signal 4" in text
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def _timed(srv: Server, n_predict: int) -> dict:
    timings = srv.post("/completion", request(PROMPT, n_predict)).get("timings") or {}
    return {
        "prompt_tokens": timings.get("prompt_n"),
        "prompt_per_second": round(float(timings.get("prompt_per_second") or 0), 2),
        "predicted_tokens": timings.get("predicted_n"),
        "predicted_per_second": round(float(timings.get("predicted_per_second") or 0), 2),
    }


def speed(
    builds: dict[str, Artifact],
    model: Path,
    rounds: int,
    n_predict: int,
    logs: Path,
    say: Callable[[str], None],
) -> dict[str, list[dict]]:
    """Each build's server on this CPU, alternating for `rounds`: one warm-up request, then
    one measured request of `n_predict` tokens after a ~300-token prompt."""
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for r in range(rounds):
        for name, art in builds.items():
            with running(art.server, base_args(model), logs / f"speed-{name}-{r}.log") as srv:
                srv.post("/completion", request("Hello", 4))
                runs[name].append(_timed(srv, n_predict))
            last = runs[name][-1]
            say(
                f"bench-portable: round {r + 1}/{rounds} {name}: "
                f"{last['prompt_per_second']} prompt tok/s, "
                f"{last['predicted_per_second']} generated tok/s"
            )
    return runs


def _median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def bench_portable(
    portable: Artifact,
    native: Artifact,
    model: Path | None,
    reports: Path,
    console: Console,
    *,
    cpu: str = DEFAULT_CPU,
    rounds: int = 3,
    n_predict: int = 128,
) -> dict:
    """The whole comparison (see the module docstring) on `model` (None: the embedded
    Gemma 3 270M); writes the report, returns it."""
    model = model or embedded_model(console.print)
    for role, art, want in (("--artifact", portable, False), ("--native", native, True)):
        if backends.backend(art.manifest.get("backend")).gpu:
            raise LlamaspecError(f"{role} {art.id} is a {art.manifest.get('backend')} build; "
                                 "bench-portable compares two CPU builds.")  # fmt: skip
        native_build = _is_native(art)
        if native_build != want:
            kind = "a GGML_NATIVE=ON" if want else "a portable (GGML_NATIVE=OFF)"
            raise LlamaspecError(
                f"{role} {art.id} is not {kind} build. Give --artifact a `--variant portable` "
                "build and --native a default build of the same pin."
            )
    if portable.manifest.get("commit") != native.manifest.get("commit"):
        raise LlamaspecError(
            f"{portable.id} and {native.id} are builds of different commits; compare two "
            "builds of the same pin (`llamaspec build` with and without --variant portable)."
        )
    cpu = cpu_model(cpu)
    logs = reports / f"portable-{portable.id}-logs"  # not committed (.gitignore)
    logs.mkdir(parents=True, exist_ok=True)
    builds = {"portable": portable, "native": native}
    emulated = {}
    for name, art in builds.items():
        console.print(f"bench-portable: {name} {art.id} under qemu-x86_64 -cpu {cpu} …")
        emulated[name] = emulated_run(art, model, cpu, logs)
        console.print(f"bench-portable: {name}: {_emulated_line(emulated[name])}")
    console.print("bench-portable: counting AVX/AVX-512 instructions (objdump) …")
    wide = {name: wide_instructions(elf_files(art)) for name, art in builds.items()}
    runs = speed(builds, model, rounds, n_predict, logs, console.print)
    summary = {
        name: {
            "prompt_per_second": _median(runs[name], "prompt_per_second"),
            "predicted_per_second": _median(runs[name], "predicted_per_second"),
        }
        for name in builds
    }
    report = {
        "artifact": portable.id,
        "native": native.id,
        "commit": portable.manifest.get("commit"),
        "model": model.name,
        "host_cpu": _host_cpu(),
        "emulator": _qemu_version(),
        "emulated": emulated,
        "wide_instructions": wide,
        "rounds": rounds,
        "n_predict": n_predict,
        "runs": runs,
        "median": summary,
        "cost": {
            key: round(1 - summary["portable"][key] / summary["native"][key], 4)
            if summary["native"][key]
            else None
            for key in ("prompt_per_second", "predicted_per_second")
        },
    }
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / f"portable-{portable.id}"
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))
    console.print(f"bench-portable: report {stem}.md")
    return report


def _is_native(art: Artifact) -> bool:
    return art.manifest.get("reproducible") == repro.NATIVE


def _emulated_line(run: dict) -> str:
    if run["answered"]:
        backend = f" (CPU backend {run['cpu_backend']})" if run["cpu_backend"] else ""
        return f"answered {run['text']!r}{backend} in {run['seconds']} s"
    why = "illegal instruction" if run["illegal_instruction"] else run.get("error", "")
    return f"FAILED: {why}"


def _host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _qemu_version() -> str:
    out = subprocess.run([qemu(), "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()[0] if out.stdout else "qemu-x86_64"


def markdown(r: dict) -> str:
    """The report as Markdown."""
    cpu = r["emulated"]["portable"]["cpu"]
    lines = [
        f"# Portable build {r['artifact']}: an emulated {cpu} CPU, and the cost on this one",
        "",
        f"Same pin ({r['commit'][:12]}), same model ({r['model']}). Portable: "
        f"`{r['artifact']}`; native (GGML_NATIVE=ON): `{r['native']}`. Host CPU: "
        f"{r['host_cpu']}; emulator: {r['emulator']}.",
        "",
        f"## Under `qemu-x86_64 -cpu {cpu}`",
        "",
        "| build | answered | CPU backend loaded | illegal instruction | seconds |",
        "|---|---|---|---|---:|",
    ]
    for name, run in r["emulated"].items():
        answered = f"yes: {run['text']!r}" if run["answered"] else "no"
        lines.append(
            f"| {name} | {answered} | {run['cpu_backend'] or '—'} | "
            f"{'yes' if run['illegal_instruction'] else 'no'} | {run['seconds']} |"
        )
    lines += [
        "",
        "## AVX/AVX-512 instructions per file (objdump; the emulated CPU has neither)",
        "",
        "| build | file | instructions |",
        "|---|---|---:|",
    ]
    for name, files in r["wide_instructions"].items():
        for file, count in files.items():
            lines.append(f"| {name} | {file} | {count} |")
    lines += [
        "",
        f"## Speed on this CPU (median of {r['rounds']} alternating rounds, "
        f"{r['n_predict']} tokens generated)",
        "",
        "| build | prompt tok/s | generated tok/s |",
        "|---|---:|---:|",
    ]
    for name, m in r["median"].items():
        lines.append(f"| {name} | {m['prompt_per_second']} | {m['predicted_per_second']} |")
    cost = r["cost"]
    lines += [
        "",
        "Portability cost (1 − portable/native): prompt "
        f"{_pct(cost['prompt_per_second'])}, generation {_pct(cost['predicted_per_second'])}.",
        "",
    ]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"
