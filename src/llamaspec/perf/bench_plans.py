"""Which `BenchPlan` a `bench` run asks for: a catalog recipe's, or an ad-hoc one for a
target file (and draft, and spec types), optionally with more llama-server arguments for
both servers (checked against the binary's --help, and named in the report's stem)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import LlamaspecError, did_you_mean

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.engine.artifact import Artifact
    from llamaspec.perf.bench import BenchPlan


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
    from llamaspec.perf import tune

    if target is not None:
        adhoc = tune.adhoc_recipe(target, draft, spec, n_max)
        return tune.recipe_plan(artifact, adhoc, target, draft, console)
    found, target, draft = tune.recipe_models(recipe, console)
    if n_max:
        found = found.model_copy(
            update={"spec": found.spec.model_copy(update={"draft_n_max": n_max})}
        )
    return tune.recipe_plan(artifact, found, target, draft, console)


def with_server_args(p: BenchPlan, extra: list[str], artifact: Artifact) -> BenchPlan:
    """`p` with `extra` on both servers; each option must be one the binary's --help lists."""
    from llamaspec.models import dialects

    known = dialects.help_flags(dialects.server_help(artifact.server))
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
