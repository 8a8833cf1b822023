"""Bench plans: a recipe rendered for a build and split into the plain and speculative
server arguments (`recipe_plan`), for a catalog recipe with its pair's files
(`recipe_models`) or an ad-hoc recipe for a target file, draft and spec types
(`adhoc_recipe`); bench, tune and draft measure all start from one. `bench_plan` is the plan
a `bench` run asks for, optionally with more llama-server arguments for both servers
(checked against the binary's --help, and named in the report's stem); `run_bench` is that
run whole: the plan, then `bench.bench`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaspec import config
from llamaspec import lock as lockfile
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.models import catalog, dialects, help_check, recipes, server_help
from llamaspec.paths import project_root
from llamaspec.perf import bench
from llamaspec.perf.bench import BenchPlan
from llamaspec.perf.bench_report import BenchReport
from llamaspec.perf.workloads import Workload


def recipe_models(name: str, console: Console) -> tuple[config.Recipe, Path, Path | None]:
    """A catalog recipe and its pair's files on disk (verified by `models pull`).

    Only the embedded model (and copies made from it) is fetched here; other pairs must be
    pulled first."""
    root = project_root()
    recipe, models = recipes.find(name, root)
    pair = models.pairs[recipe.pair]
    handles = [h for h in (pair.target, pair.draft) if h is not None]
    locked = lockfile.load(root)["models"]
    missing = [h for h in handles if not catalog.on_hand(models, h, locked)]
    if missing:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} needs pair {recipe.pair!r}, whose model(s) "
            f"{', '.join(missing)} are not downloaded. `llamaspec models pull {recipe.pair}` "
            "fetches and verifies them; bench and tune download only the embedded pair "
            "themselves."
        )
    files = catalog.pull(models, recipe.pair, root, console)
    return recipe, files.target, files.draft


def adhoc_recipe(
    target: Path, draft: Path | None, types: Sequence[str], n_max: int | None
) -> config.Recipe:
    """A recipe for `--target FILE [--draft FILE] --spec TYPE…`."""
    for path, what in ((target, "--target"), (draft, "--draft")):
        if path is not None and not Path(path).is_file():
            raise LlamaspecError(
                f"{what} {path} is not a file. Give the path of a GGUF model on this machine "
                "(`llamaspec models pull PAIR` prints where pulled models are)."
            )
    if not types:
        raise LlamaspecError(
            "An ad-hoc bench needs --spec TYPE (repeatable to stack), e.g. --spec ngram-mod, "
            f"or --spec draft with --draft FILE. Spec types: {', '.join(config.SPEC_TYPES)}."
        )
    for t in types:
        if t not in config.SPEC_TYPES:
            raise LlamaspecError(
                f"Unknown spec type {t!r}.{did_you_mean(t, config.SPEC_TYPES)} Spec types: "
                f"{', '.join(config.SPEC_TYPES)}."
            )
    if draft is None and any(t in dialects.MODEL_TYPES for t in types):
        raise LlamaspecError(
            f"--spec {'/'.join(t for t in types if t in dialects.MODEL_TYPES)} drafts with a "
            "draft model: add --draft FILE, or pick a draft-free type such as ngram-mod."
        )
    spec: dict[str, Any] = {"types": list(dict.fromkeys(types))}
    if n_max:
        spec["draft_n_max"] = n_max
    stem = re.sub(r"[^a-z0-9._-]+", "-", Path(target).stem.lower()).strip("-.") or "model"
    return config.parse(
        config.Recipe,
        {
            "name": f"adhoc-{stem}"[:60],
            "pair": "adhoc",
            "description": f"ad-hoc: {Path(target).name}, {', '.join(types)}",
            "spec": spec,
            "server": {"ctx": 4096, "parallel": 1},
        },
        "the ad-hoc bench settings",
    )


def supported_types(dialect: str, help_text: str) -> set[str]:
    """The spec types this binary offers: its dialect's, minus those its --help lacks."""
    d = dialects.find_dialect(dialect)
    choices = server_help.spec_type_choices(help_text)
    out = set()
    for t in d.types:
        listed = choices is None or d.type_names.get(t) in choices
        if t in d.by_model or t in d.switches or listed:
            out.add(t)
    return out


def recipe_plan(
    artifact: Artifact,
    recipe: config.Recipe,
    target: Path,
    draft: Path | None,
    console: Console,
    *,
    dialect: str | None = None,
    help_text: str | None = None,
) -> BenchPlan:
    """Render `recipe` for this artifact, check it against the binary's --help, and split
    it into the plain and speculative server arguments."""
    m = artifact.manifest
    engine = m["engine"]
    dialect = dialect or dialects.dialect_for(artifact, console.print)
    help_text = help_text if help_text is not None else server_help.server_help(artifact.server)
    offered = supported_types(dialect, help_text)
    lacking = [t for t in recipe.for_engine(engine).spec.types if t not in offered]
    if lacking:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} uses spec type {', '.join(lacking)}, which this build "
            f"({artifact.id}, {engine} {str(m.get('commit') or 'local')[:12]}) lacks; it has "
            f"{', '.join(sorted(offered)) or 'none'}. Pick a recipe with one of those, or "
            "build a pin that has it."
        )
    cmd = recipes.render_for(recipe, artifact, dialect, target, draft)
    help_check.check_against_help(cmd, help_text, f"{artifact.id}/llama-server")
    spec = recipe.for_engine(engine).spec
    # n-gram drafts run to their engine's own defaults (upstream: ngram-mod 64, maps 48)
    ngram_default = 64 if any(t.startswith("ngram") for t in spec.types) else 0
    longest = max(spec.ngram_mod_n_max or ngram_default, _extra_size_m(cmd.argv))
    k_max = max(spec.draft_n_max, longest, 16) + 1
    return bench.plan(recipe.name, cmd.argv, spec.types, Path(target), draft, min(k_max, 65))


def _extra_size_m(argv: Sequence[str]) -> int:
    sizes = [int(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a.endswith("-size-m")]
    return max(sizes, default=0)


def bench_plan(
    artifact: Artifact,
    recipe: str,
    target: Path | None,
    draft: Path | None,
    spec: Sequence[str],
    n_max: int | None,
    console: Console,
) -> BenchPlan:
    """With `target`: an ad-hoc recipe for the files and `spec` types; else the catalog
    recipe `recipe` with its pair's files. `n_max` overrides the draft length."""
    if target is not None:
        adhoc = adhoc_recipe(target, draft, spec, n_max)
        return recipe_plan(artifact, adhoc, target, draft, console)
    found, target, draft = recipe_models(recipe, console)
    if n_max:
        found = found.model_copy(
            update={"spec": found.spec.model_copy(update={"draft_n_max": n_max})}
        )
    return recipe_plan(artifact, found, target, draft, console)


def with_server_args(p: BenchPlan, extra: list[str], artifact: Artifact) -> BenchPlan:
    """`p` with `extra` on both servers; each option must be one the binary's --help lists."""
    known = server_help.help_flags(server_help.server_help(artifact.server))
    for a in extra:
        if a.startswith("-") and not a.lstrip("-").replace(".", "").isdigit():
            flag = a.split("=", 1)[0]
            if flag not in known:
                raise LlamaspecError(
                    f"--server-arg {a}: {artifact.id}'s llama-server has no option {flag}."
                    f"{did_you_mean(flag, sorted(known))} Pass options its --help lists, one "
                    "word per --server-arg (e.g. --server-arg=-fa --server-arg=off)."
                )
    return replace(p, plain_args=(*p.plain_args, *extra))


def server_args_stem(p: BenchPlan, extra: Sequence[str], artifact: Artifact) -> str:
    """The report's stem for a run with `extra` server arguments: they are in its name."""
    slug = "-".join(a.lstrip("-") for a in extra)
    return f"bench-{p.name}-{artifact.id}-{''.join(c if c.isalnum() else '-' for c in slug)}"


def run_bench(
    artifact: Artifact,
    recipe: str,
    target: Path | None,
    draft: Path | None,
    spec: Sequence[str],
    n_max: int | None,
    server_args: Sequence[str],
    mix: Sequence[Workload],
    reports: Path,
    console: Console,
    *,
    concurrency: Sequence[int] = (1, 4),
    repetitions: int = 3,
    cost_model: bool = True,
) -> BenchReport:
    """`llamaspec bench`: the plan `bench_plan` makes (with `server_args` on both servers and
    in the report's name), benched on `mix`; the report."""
    p = bench_plan(artifact, recipe, target, draft, spec, n_max, console)
    stem = None
    if server_args:
        p = with_server_args(p, list(server_args), artifact)
        stem = server_args_stem(p, server_args, artifact)
    return bench.bench(
        artifact,
        p,
        mix,
        reports,
        console,
        concurrency=concurrency,
        repetitions=repetitions,
        cost_model=cost_model,
        stem=stem,
    )
