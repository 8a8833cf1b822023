"""`draft find --measure`: pull the best drafts that fit in memory, check and time them on
the user's build, and write the winner as `recipes/<target>-draft.yaml` in the user config
dir, beside the `models.yaml` that names its pair.

Memory is estimated, not measured: the target's and the draft's GGUF sizes (the weights
are loaded as stored) plus an F16 KV cache for both at the chosen context (2 bytes × layers
× KV heads × (K + V head length) × context, from each header), plus a fixed
allowance for compute buffers. Each candidate must pass verify's fast equivalence check
(the same one tune uses) before it is timed; the timing is one run of the `copy` workload
on a plain server and on the speculative one, on this build. `draft_find` is the whole
`draft find [--measure]`: the search (models.drafts), then, when asked, the measurement.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape

from llamaspec import config
from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact, load_artifact, newest_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects, drafts, gguf_header, hub
from llamaspec.models.server_help import server_help
from llamaspec.paths import default_out, user_config
from llamaspec.perf import bench, bench_plans, tune, workloads
from llamaspec.proof import verify
from llamaspec.runtime.client import running

COMPUTE_ALLOWANCE = 256 << 20  # compute buffers and the server itself, per model, roughly
KV_BYTES = 2  # F16 K and V cache entries (llama-server's default cache type)
DRAFT_N_MAX = 4
WORKLOAD = "copy"


def kv_cache(info: gguf_header.TokenizerInfo, ctx: int) -> int | None:
    """Bytes of an F16 KV cache for `ctx` tokens, from the header's shape keys."""
    layers = info.dim("block_count")
    heads = info.dim("attention.head_count")
    kv_heads = info.dim("attention.head_count_kv") or heads
    embd = info.dim("embedding_length")
    k = info.dim("attention.key_length") or (embd // heads if embd and heads else None)
    v = info.dim("attention.value_length") or k
    if not (layers and kv_heads and k and v):
        return None
    return KV_BYTES * layers * kv_heads * (k + v) * ctx


@dataclass(frozen=True)
class Need:
    total: int
    detail: str


def need(
    target: drafts.Source, tinfo: gguf_header.TokenizerInfo, c: drafts.Candidate, ctx: int
) -> Need:
    """The memory a target + draft pair needs at `ctx`, and how that was reckoned."""
    parts = []
    total = 0
    for what, size, info in (("target", target.size, tinfo), ("draft", c.source.size, c.info)):
        kv = kv_cache(info, ctx) if info else None
        if kv is None:  # no shape keys: assume the cache is as large as the weights
            kv = size or 0
        total += (size or 0) + kv + COMPUTE_ALLOWANCE
        parts.append(f"{what} {drafts.human(size, 'B')} + KV {drafts.human(kv, 'B')}")
    allowance = drafts.human(COMPUTE_ALLOWANCE, "B")
    detail = f"{'; '.join(parts)}; {allowance} per model for buffers"
    return Need(total, detail)


ASSUMED = (
    "memory = GGUF file sizes (weights as stored) + F16 K/V cache of both models at the "
    "context (2 B × layers × KV heads × (K + V head length) × ctx, from each header) + "
    f"{COMPUTE_ALLOWANCE >> 20} MiB per model for compute buffers; CPU or a single device, "
    "no offload split"
)


def handle(text: str) -> str:
    h = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return h or "model"


def _pull(source: drafts.Source, console: Console) -> tuple[Path, hub.Downloaded | None]:
    if source.path is not None:
        return source.path, None
    model = config.ModelFile(repo=source.repo, file=source.file, tokenizer="?", license="?")
    got = hub.download(source.label, model, None, console)
    return got.path, got


@dataclass(frozen=True)
class Measured:
    candidate: drafts.Candidate
    path: Path
    downloaded: hub.Downloaded | None
    passed: bool
    check: str
    speedup: float = 0.0
    plain_tps: float = 0.0
    spec_tps: float = 0.0
    accepted: tuple[int, int] = (0, 0)


def measure(
    found: drafts.Found,
    artifact: Artifact,
    console: Console,
    *,
    memory_gb: float,
    ctx: int,
    top: int,
    reports: Path,
    out_dir: Path | None = None,
) -> Path | None:
    """Measure the top `top` compatible drafts that fit `memory_gb`; write the winner's
    recipe and the models and pair it names; return the recipe's path (None: no compatible
    draft; `ngram` measures the draft-free alternative then)."""
    compatible = [c for c in found.candidates if c.ok]
    if not compatible:
        return None
    budget = int(memory_gb * (1 << 30))
    needs = {c.source.label: need(found.target, found.info, c, ctx) for c in compatible}
    console.print(f"draft measure: assumed {ASSUMED}")
    fitting = [c for c in compatible if needs[c.source.label].total <= budget][:top]
    if not fitting:
        least = min(compatible, key=lambda c: needs[c.source.label].total)
        n = needs[least.source.label]
        raise LlamaspecError(
            f"No compatible draft fits in --memory {memory_gb:g} GiB at --ctx {ctx}: the "
            f"smallest pair, with {least.source.label}, needs {drafts.human(n.total, 'B')} "
            f"({n.detail}). Give more memory, a smaller --ctx, or a smaller quantization of the "
            f"target. Assumed: {ASSUMED}."
        )
    for c in fitting:
        n = needs[c.source.label]
        console.print(
            f"draft measure: {c.source.label} needs about {drafts.human(n.total, 'B')} "
            f"({n.detail}) of {memory_gb:g} GiB"
        )
    target_path, target_dl = _pull(found.target, console)
    checked_on, checked_what = tune.check_model(target_path, console)
    logs = reports / f"draft-{handle(Path(found.target.file).stem)}-{artifact.id}-logs"
    results: list[Measured] = []
    for i, c in enumerate(fitting):
        path, dl = _pull(c.source, console)
        t = _time(artifact, target_path, path, ["draft"], checked_on, logs, f"draft-{i}", console)
        if not t.check.passed:
            console.print(f"draft measure: {c.source.label} refused by the check: {t.check.detail}")
            results.append(Measured(c, path, dl, False, t.check.detail))
            continue
        console.print(f"draft measure: {c.source.label}: {t.line}")
        results.append(
            Measured(
                c, path, dl, True, t.check.detail, t.speedup, t.plain_tps, t.spec_tps,
                t.accepted,
            )
        )  # fmt: skip
    passed = [r for r in results if r.passed]
    if not passed:
        raise LlamaspecError(
            f"Every draft measured failed the equivalence check on {checked_what}: "
            + "; ".join(f"{r.candidate.source.label}: {r.check}" for r in results)
            + ". Nothing was written."
        )
    best = max(passed, key=lambda r: r.speedup)
    md = report(found, artifact, results, best, checked_what, ctx, reports, logs.name[:-5])
    return write(found, artifact, best, target_dl, ctx, checked_what, out_dir, md)


def draft_find(
    target: str,
    console: Console,
    *,
    limit: int = 20,
    extra_terms: Sequence[str] = (),
    measuring: bool = False,
    memory_gb: float | None = None,
    ctx: int = 4096,
    top: int = 2,
    reports: Path | None = None,
    dist: Path | None = None,
    artifact_id: str | None = None,
) -> Path | None:
    """`draft find`: search and judge drafts for `target` (printed); with `measuring`, time
    the best that fit `memory_gb` (default: this machine's RAM) on the build `artifact_id`
    in `dist` (default: the newest) and return the recipe written. None: nothing written
    (with no compatible draft, draft-free ngram-mod is measured and said instead)."""
    found = drafts.find_and_show(target, console, limit=limit, extra_terms=extra_terms)
    if not measuring:
        return None
    dist = dist or default_out("dist")
    artifact = load_artifact(dist, artifact_id or newest_artifact(dist))
    memory = memory_gb or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    reports = reports or default_out("reports")
    if not any(c.ok for c in found.candidates):
        console.print(escape(ngram(found, artifact, console, reports)))
        return None
    return measure(found, artifact, console, memory_gb=memory, ctx=ctx, top=top, reports=reports)


@dataclass(frozen=True)
class Timing:
    check: verify.FastCheck
    plain_tps: float = 0.0
    spec_tps: float = 0.0
    accepted: tuple[int, int] = (0, 0)

    @property
    def speedup(self) -> float:
        return round(self.spec_tps / self.plain_tps, 3) if self.plain_tps else 0.0

    @property
    def line(self) -> str:
        return (
            f"{self.check.detail}; {WORKLOAD} {self.plain_tps:.1f} → {self.spec_tps:.1f} tok/s "
            f"({self.speedup:.2f}×), {self.accepted[0]}/{self.accepted[1]} drafted tokens "
            "accepted"
        )


def _time(
    artifact: Artifact,
    target: Path,
    draft: Path | None,
    types: list[str],
    checked_on: Path,
    logs: Path,
    tag: str,
    console: Console,
) -> Timing:
    """Verify's fast equivalence check, then (if it passed) one `copy` run on a plain
    server and one on the speculative server, on this build."""
    dialect = dialects.dialect_for(artifact, lambda _m: None)
    help_text = server_help(artifact.server)
    recipe = bench_plans.adhoc_recipe(target, draft, types, DRAFT_N_MAX if draft else None)
    p = bench_plans.recipe_plan(
        artifact, recipe, target, draft, console, dialect=dialect, help_text=help_text
    )
    check = verify.fast_check(
        artifact, dialect, checked_on, list(p.spec_args), console, logs / f"check-{tag}"
    )
    if not check.passed:
        return Timing(check)
    w = workloads.select([WORKLOAD])[0]
    plain_args = [*bench.with_slots(p.plain_args, 1), "--metrics"]
    with running(artifact.server, plain_args, logs / f"plain-{tag}.log") as srv:
        plain = bench.run(srv, w, 1)
    with running(artifact.server, [*plain_args, *p.spec_args], logs / f"spec-{tag}.log") as srv:
        spec = bench.run(srv, w, 1)
    return Timing(
        check, plain.tokens_per_second, spec.tokens_per_second, (spec.accepted, spec.drafted)
    )


def ngram(found: drafts.Found, artifact: Artifact, console: Console, reports: Path) -> str:
    """No draft fits: measure draft-free `ngram-mod` on the target instead, one paragraph."""
    target_path, _ = _pull(found.target, console)
    checked_on, checked_what = tune.check_model(target_path, console)
    logs = reports / f"draft-{handle(Path(found.target.file).stem)}-{artifact.id}-logs"
    t = _time(artifact, target_path, None, ["ngram-mod"], checked_on, logs, "ngram", console)
    if not t.check.passed:
        return (
            f"Draft-free ngram-mod on {artifact.id} failed the fast equivalence check on "
            f"{checked_what} ({t.check.detail}); see the logs in {logs}."
        )
    return (
        f"Measured instead, without a draft model: ngram-mod on {artifact.id}: {t.line} "
        f"(fast check on {checked_what}). Use it with a recipe whose spec is `types: "
        "[ngram-mod]` (e.g. `llamaspec recipe show gemma3-270m-ngram-tuned` for the form)."
    )


def report(
    found: drafts.Found,
    artifact: Artifact,
    results: list[Measured],
    best: Measured,
    checked_what: str,
    ctx: int,
    reports: Path,
    stem: str,
) -> Path:
    """reports/draft-<target>-<artifact>.md: every draft measured, and the winner."""
    lines = [
        f"# Drafts for {found.target.label} on {artifact.id}",
        "",
        f"- machine: {toolchain.machine()['description']}",
        f"- context {ctx}; {ASSUMED}",
        f"- each draft passed verify's fast equivalence check (on {checked_what}) before it "
        f"was timed: one `{WORKLOAD}` run on a plain server, then on the speculative one "
        f"(draft n-max {DRAFT_N_MAX})",
        "",
        "| draft | check | plain tok/s | speculative tok/s | speedup | accepted/drafted |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.candidate.source.label} | {r.check} | {r.plain_tps:.1f} | {r.spec_tps:.1f} "
            f"| {r.speedup:.2f}× | {r.accepted[0]}/{r.accepted[1]} |"
        )
    lines += ["", f"Written as a recipe: **{best.candidate.source.label}**."]
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write(
    found: drafts.Found,
    artifact: Artifact,
    best: Measured,
    target_dl: hub.Downloaded | None,
    ctx: int,
    checked_what: str,
    out_dir: Path | None,
    report_md: Path,
) -> Path:
    """The user's models.yaml gains the target (unless the catalog has it), the draft and
    the pair; recipes/<target>-draft.yaml beside it gets the measured settings. Both are
    validated before either is written."""
    target = found.target
    if target.handle is None and target.repo is None:
        raise LlamaspecError(
            f"A recipe names its models by Hub repo, and the target {target.label} is a local "
            "file: the measurement above stands, but no recipe was written. Run `draft find "
            "--measure` on the target's Hub repo (owner/name:file.gguf) to get one."
        )
    t_handle = target.handle or handle(Path(target.file).stem)
    d = best.candidate
    d_handle = handle(Path(d.source.file).stem)
    family = found.info.basename or found.info.arch
    models: dict[str, dict] = {}
    if target.handle is None:
        models[t_handle] = _entry(target, target_dl, family, found.info)
    models[d_handle] = _entry(d.source, best.downloaded, family, d.info)
    pair = f"{t_handle}-draft"
    path = user_config() / "models.yaml"
    mine = (config.read_yaml(path) if path.is_file() else None) or {}
    for key, new in (
        ("models", models),
        ("pairs", {pair: {"target": t_handle, "draft": d_handle}}),
    ):
        mine[key] = {**(mine.get(key) or {}), **new}
    path.parent.mkdir(parents=True, exist_ok=True)
    m = artifact.manifest
    data = {
        "pair": pair,
        "description": f"{d.source.label} drafting for {target.handle or target.label}, found "
        "and measured by `llamaspec draft find --measure`.",
        "spec": {"types": ["draft"], "draft_n_max": DRAFT_N_MAX},
        "server": {"ctx": ctx, "parallel": 1},
        "measured": {
            "hardware": toolchain.machine()["description"],
            "engine": f"{m['engine']} {str(m.get('commit') or 'local')[:12]} "
            f"({m.get('backend', 'cpu')})",
            "artifact": artifact.id,
            "date": dt.date.today().isoformat(),
            "result": f"{WORKLOAD} {best.plain_tps:.1f} -> {best.spec_tps:.1f} tok/s "
            f"({best.speedup:.2f}x), {best.accepted[0]}/{best.accepted[1]} drafted tokens "
            f"accepted; fast equivalence check on {checked_what}: {best.check}",
            "report": tune.relative(report_md),
        },
    }
    name = f"{t_handle}-draft"
    config.parse(config.Recipe, {"name": name, **data}, f"the measured recipe {name}")
    config.parse(config.ModelsFile, mine, str(path))
    path.write_text(yaml.safe_dump(mine, sort_keys=False, allow_unicode=True))
    where = out_dir or (user_config() / "recipes")
    where.mkdir(parents=True, exist_ok=True)
    out = where / f"{name}.yaml"
    header = f"# Written by `llamaspec draft find {target.handle or target.label} --measure`.\n"
    out.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return out


def _entry(
    source: drafts.Source,
    got: hub.Downloaded | None,
    family: str,
    info: gguf_header.TokenizerInfo | None,
) -> dict:
    entry: dict = {"repo": source.repo, "file": source.file, "tokenizer": family}
    entry["license"] = "see the repo"
    if got is not None:
        if got.commit:
            entry["revision"] = got.commit
        entry["sha256"] = got.sha256[0]
    if source.size:
        entry["size"] = source.size
    if info is not None and info.params:
        entry["params"] = drafts.human(info.params)
    q = drafts.quant_of(source.file)
    if q != "?":
        entry["quant"] = q
    return entry
