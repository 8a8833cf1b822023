"""`llamaspec bump`: move an engine's pin forward, re-judging the patch queue on the way.

The plan (resolve, fetch, judge) is maint/bump.py's, as are the report (maint/bump_report.py)
and the pin edit (maint/pin_edit.py); with --build the candidate is built by the pipeline,
smoke-tested and checked by verify's fast check here. engines.yaml and llamaspec.lock change
only when every step asked for passed; the report under reports/ is written either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import LlamaspecError, choose

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.maint import bump, bump_report


@dataclass(frozen=True)
class Request:
    """What a bump asks for (the `llamaspec bump` options)."""

    engine: str
    to: str = "latest"  # a SHA, or `latest`
    source_dir: Path | None = None  # a clone or mirror with history instead of the remote
    build: bool = False  # also build, smoke-test and verify the candidate
    allow_downgrade: bool = False
    dry_run: bool = False
    reports: Path | None = None  # default: reports/ in the project
    patch_source: str | None = None
    dist: Path = field(default_factory=lambda: Path("dist"))
    jobs: int | None = None


def run(request: Request, console: Console) -> None:
    """Judge the candidate pin (and with `build`, prove it); edit the pin when all pass."""
    from llamaspec import config
    from llamaspec.maint import bump, bump_report, pin_edit
    from llamaspec.paths import project_root

    root = project_root()
    engines = config.load_engines(root)
    engine = engines[choose("engine", request.engine, engines)]
    bump.check_to(request.to)
    if request.patch_source:
        from llamaspec.engine.patch_sources import check_patch_source

        check_patch_source(request.patch_source)
    if request.build:
        from llamaspec.engine.artifact import check_dist

        check_dist(request.dist)
    say = console.print
    plan = bump.plan(
        engine,
        request.to,
        request.source_dir,
        request.patch_source,
        request.allow_downgrade,
        root,
        say,
    )
    if plan.direction == "same":
        say(f"bump: {engine.name} is already at {engine.pin[:12]} ({plan.how}); nothing to do")
        return
    _print_plan(plan, console)
    out = bump_report.Outcome(
        pypi=bump.pypi_news(engine),
        other_files=bump.files_naming(root, engine.pin),
        defects=bump.defects_at(root, engine.name, engine.pin),
    )
    problems = plan.blocking
    if problems:
        out.reason = f"the patch queue does not hold at {plan.new.short}: " + "; ".join(problems)
    elif request.build:
        out.built = True
        out.reason = _prove(plan, request, console, out)
        if not out.reason:
            out.health = _health(plan, request, console)
        if out.dialect and out.dialect != plan.candidate.dialect:
            say(f"bump: the candidate speaks the {out.dialect!r} dialect (was {engine.dialect!r})")
            plan = replace(
                plan, candidate=plan.candidate.model_copy(update={"dialect": out.dialect})
            )
    say(f"pypi: {out.pypi.line}")
    if out.reason:
        out.status = "refused"
    elif request.dry_run:
        out.status = "dry-run"
    else:
        out.status = "updated"
        out.changed = ["engines.yaml", "llamaspec.lock"]
    reports = request.reports or root / "reports"
    md, js = bump_report.write_report(reports, plan, out)
    say(f"bump: report {_shown(md)} (and {js.name})")
    if out.status == "refused":
        raise LlamaspecError(
            f"bump {engine.name} {plan.old.short} → {plan.new.short} refused: {out.reason}. "
            f"engines.yaml and llamaspec.lock are unchanged; the report is {_shown(md)}."
        )
    if out.status == "dry-run":
        say("bump: dry run: engines.yaml and llamaspec.lock are unchanged")
        return
    changed = pin_edit.apply(root, plan)
    dropped = " (its PyPI mirror, of the old pin, dropped)" if engine.pypi else ""
    say(
        f"bump: {engine.name} pinned at {plan.new.commit} ({plan.new.tag}, {plan.new.date})"
        f"{dropped}; updated {' and '.join(changed)}"
    )


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _print_plan(plan: bump.Plan, console: Console) -> None:
    from rich.table import Table

    o, n = plan.old, plan.new
    between = (
        f"{plan.commits_between} commits"
        + (f" (from the {plan.counted_by})" if plan.counted_by not in ("", "history") else "")
        if plan.commits_between is not None
        else "commits between unknown (no history)"
    )
    console.print(
        f"bump: {plan.engine.name} {o.short} ({o.date}, {o.tag}) → {n.short} ({n.date}, "
        f"{n.tag}); {plan.how}; {between}"
    )
    table = Table(title=f"patch queue: {plan.engine.name} at {o.short} and at {n.short}")
    for col in ("patch", "PR", "default", f"at {o.short}", f"at {n.short}", "change"):
        table.add_column(col, overflow="fold")
    for r in plan.rows:
        change = r.change or "-"
        if r.blocking:
            change += f" (blocks: {r.blocking})"
        table.add_row(
            r.id,
            r.pr,
            "on" if r.default else "off",
            r.before.status,
            f"{r.after.status}: {r.after.note}",
            change,
        )
    console.print(table)
    for label, key in (
        ("went in-base", "went in-base"),
        ("now conflict", "now conflicts"),
        ("newly apply", "newly applies"),
    ):
        console.print(f"bump: {label}: {', '.join(plan.ids(key)) or 'none'}")


def _prove(plan: bump.Plan, request: Request, console: Console, out: bump_report.Outcome) -> str:
    """Build, smoke and verify the candidate; the first failure, as one line ("" if none)."""
    from llamaspec.engine.pipeline import BuildSpec, run_build
    from llamaspec.models.dialects import probe_dialect
    from llamaspec.models.server_help import server_help
    from llamaspec.paths import project_root
    from llamaspec.proof.smoke import smoke_artifact

    root = project_root()
    spec = BuildSpec(
        engine=plan.engine.name,
        pin=plan.new.commit,
        source="local" if plan.mirror else "git",
        source_dir=plan.mirror,
        dist=request.dist,
        jobs=request.jobs,
        patch_source=plan.patch_source,
    )
    artifact = None
    for name in ("build", "smoke", "verify"):
        try:
            if name == "build":
                artifact = run_build(spec, console, root, engine=plan.candidate)
                detail = f"artifact {artifact.id}"
            elif name == "smoke":
                # a binary with no usage text, or no draft flags, fails here in a second,
                # before the models are prepared
                help_text = server_help(artifact.server)
                out.dialect = probe_dialect(plan.engine.name, help_text)
                _speaks(artifact, out.dialect, help_text)
                report = smoke_artifact(artifact, console, root)
                detail = (
                    f"its --help speaks {out.dialect!r}; drafts accepted "
                    f"{report.accepted}/{report.drafted}; the F32 reference's output unchanged "
                    "by speculation"
                )
            else:
                detail = _verify(artifact, console, root)
        except LlamaspecError as exc:
            out.steps.append({"step": name, "passed": False, "detail": exc.message})
            return f"the {name} of {plan.new.short} failed: {exc.message}"
        out.steps.append({"step": name, "passed": True, "detail": detail})
    return ""


def _health(plan: bump.Plan, request: Request, console: Console) -> list[str]:
    """`maint health`'s row for the current pin and for the candidate, and any regression
    between them: a word in the report, never a silent raise (it does not refuse the bump)."""
    from llamaspec.maint import health, health_report
    from llamaspec.paths import project_root

    o, n = plan.old, plan.new
    pins = [
        health.HealthPin(plan.engine.name, o.commit, o.date.isoformat(), o.tag, "current pin"),
        health.HealthPin(plan.engine.name, n.commit, n.date.isoformat(), n.tag, "candidate"),
    ]
    reports = request.reports or project_root() / "reports"
    rep = health.compare(
        pins, request.dist, reports, console, mirror=plan.mirror, records={n.commit: plan.candidate}
    )
    lines = [health_report.summary(r) for r in rep.rows]
    flags = [f"REGRESSION: {f.describe()}" for f in rep.flags]
    for line in flags or ["no regression flagged (the rule of `llamaspec maint health`)"]:
        console.print(f"bump: health: {line}")
    return lines + flags


def _speaks(artifact, dialect: str, help_text: str) -> None:
    """The binary's --help must take the draft flags its dialect renders (what the smoke
    checks first, once the models are ready)."""
    from llamaspec.models import dialects
    from llamaspec.models.server_help import check_help

    settings = dialects.SpecSettings("draft", Path("draft.gguf"), n_max=8, p_min=0.0)
    argv = dialects.spec_args(dialect, settings)
    check_help(argv, help_text, str(artifact.server))


def _verify(artifact, console: Console, root: Path) -> str:
    """verify's fast check: two prompts, draft model on the F32 reference, token-identical."""
    from llamaspec.models import dialects
    from llamaspec.models.embedded import EMBEDDED_SHA256, embedded_model
    from llamaspec.proof import verify
    from llamaspec.proof.reference import reference_copy

    ref = reference_copy(embedded_model(console.print), EMBEDDED_SHA256, console.print)
    dialect = dialects.dialect_for(artifact, console.print, root)
    argv = dialects.spec_args(dialect, dialects.SpecSettings("draft", ref.path, n_max=8, p_min=0.0))
    check = verify.fast_check(artifact, dialect, ref.path, argv, console)
    if not check.passed:
        raise LlamaspecError(
            f"verify's fast check (a draft model on the F32 reference) changed the output: "
            f"{check.detail}"
        )
    return f"fast check (a draft model on the F32 reference): {check.detail}"
