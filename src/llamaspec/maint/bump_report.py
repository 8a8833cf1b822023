"""Bump report: what a bump planned and what came of it, as reports/bump-<engine>-<sha>.{md,json}.

`Outcome` holds what happened after the plan (build, smoke, verify, the final word);
`write_report` writes the plan and the outcome atomically, whether the bump went through or not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llamaspec.maint.bump import Pin, Plan, PypiNews
from llamaspec.maint.pin_edit import write_atomic


@dataclass
class Outcome:
    """What happened after the plan: the build/smoke/verify steps and the final word."""

    built: bool = False
    steps: list[dict] = field(default_factory=list)  # {"step", "passed", "detail"}
    status: str = "refused"  # updated | dry-run | refused
    reason: str = ""
    changed: list[str] = field(default_factory=list)
    pypi: PypiNews | None = None
    other_files: list[str] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    dialect: str | None = None  # probed from the built candidate's --help
    health: list[str] = field(default_factory=list)  # maint health: both pins, and any flags


def to_json(p: Plan, out: Outcome) -> dict:
    def pin(x: Pin) -> dict:
        return {**asdict(x), "date": x.date.isoformat()}

    return {
        "engine": p.engine.name,
        "old": pin(p.old),
        "new": pin(p.new),
        "resolved": p.how,
        "direction": p.direction,
        "commits_between": p.commits_between,
        "counted_by": p.counted_by or None,
        "patches": [
            {
                "id": r.id,
                "pr": r.pr,
                "state": r.state,
                "default": r.default,
                "before": asdict(r.before),
                "after": asdict(r.after),
                "change": r.change or None,
                "blocking": r.blocking or None,
            }
            for r in p.rows
        ],
        "went_in_base": p.ids("went in-base"),
        "now_conflict": p.ids("now conflicts"),
        "newly_apply": p.ids("newly applies"),
        "built": out.built,
        "steps": out.steps,
        "health": out.health,
        "pypi": asdict(out.pypi) if out.pypi else None,
        "other_files_naming_old_pin": out.other_files,
        "defects_at_old_pin": out.defects,
        "dialect": {"old": p.engine.dialect, "new": out.dialect},
        "outcome": out.status,
        "reason": out.reason or None,
        "changed": out.changed,
    }


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(p: Plan, out: Outcome) -> str:
    o, n = p.old, p.new
    word = {"updated": "updated", "dry-run": "dry run", "refused": "REFUSED"}[out.status]
    lines = [
        f"# Bump {p.engine.name}: {o.short} → {n.short} ({word})",
        "",
        "| | commit | date | tag |",
        "|---|---|---|---|",
        f"| current pin | `{o.commit}` | {o.date} | {o.tag} |",
        f"| candidate | `{n.commit}` | {n.date} | {n.tag} |",
        "",
        f"- Resolved: {p.how}.",
    ]
    if p.commits_between is not None:
        by = f" (from the {p.counted_by})" if p.counted_by != "history" else ""
        lines.append(f"- Commits between: {p.commits_between}{by}.")
    else:
        lines.append(
            "- Commits between: unknown (no history here; pass --source-dir with a clone)."
        )
    if p.direction != "forward":
        lines.append(f"- Direction: {p.direction} (allowed with --allow-downgrade).")
    lines += [
        "",
        "## Patch queue",
        "",
        f"| patch | PR | default | at {o.short} | at {n.short} | change |",
        "|---|---|---|---|---|---|",
    ]
    for r in p.rows:
        change = r.change or "–"
        if r.blocking:
            change += f" — **blocks the bump**: {r.blocking}"
        lines.append(
            f"| `{r.id}` | {r.pr} | {'on' if r.default else 'off'} | {r.before.status}: "
            f"{_cell(r.before.note)} | {r.after.status}: {_cell(r.after.note)} | {change} |"
        )
    lines += [""]
    for label, key in (
        ("Went in-base", "went in-base"),
        ("Now conflict", "now conflicts"),
        ("Newly apply", "newly applies"),
    ):
        ids = p.ids(key)
        lines.append(f"- {label}: {', '.join(f'`{i}`' for i in ids) if ids else 'none'}.")
    lines += ["", "## Build, smoke, verify", ""]
    if not out.built and not out.steps:
        lines.append("Not built (pass --build).")
    for s in out.steps:
        lines.append(
            f"- {s['step']}: {'passed' if s['passed'] else 'FAILED'} — {_cell(s['detail'])}"
        )
    if out.health:
        lines += ["", "## Health: current pin and candidate (`maint health`)", ""]
        lines += [f"- {_cell(h)}" for h in out.health]
    lines += ["", "## Also", ""]
    old_dialect = p.engine.dialect
    if out.dialect is None:
        lines.append(
            "- Dialect: not probed (not built, or its --help unreadable); engines.yaml keeps "
            f"`{old_dialect}`, the old pin's. The candidate's --help decides it: a --build "
            "probes it and records it."
        )
    elif out.dialect != old_dialect:
        lines.append(f"- Dialect: `{out.dialect}` (the candidate's --help), was `{old_dialect}`.")
    else:
        lines.append(f"- Dialect: `{out.dialect}` (the candidate's --help), unchanged.")
    if out.pypi:
        lines.append(f"- PyPI: {out.pypi.line}.")
    if p.engine.pypi is not None:
        lines.append(
            f"- engines.yaml's PyPI mirror ({p.engine.pypi.package}=={p.engine.pypi.version}) "
            "vendors the old pin, so moving the pin drops it from the engine's entry: until a "
            "newer sdist is recorded there, the new pin builds from git or a local clone only."
        )
    if out.defects:
        lines.append(
            f"- Known defects recorded at the old pin: {', '.join(out.defects)}. Re-check them "
            "at the new pin (the --build smoke and verify do) and add the new pin to their "
            "`pins` in patches/series.yaml where they persist."
        )
    if out.other_files:
        lines.append(
            f"- Other files that name the old pin (review them in the same change): "
            f"{', '.join(out.other_files)}."
        )
    lines += ["", "## Outcome", ""]
    if out.status == "updated":
        lines.append(f"Updated {' and '.join(out.changed)}.")
    elif out.status == "dry-run":
        lines.append("Dry run: no file but this report was changed.")
    else:
        lines.append(f"Refused: {out.reason}. No file but this report was changed.")
    return "\n".join(lines) + "\n"


def report_paths(reports: Path, p: Plan) -> tuple[Path, Path]:
    """reports/bump-<engine>-<short sha>.md and .json."""
    stem = f"bump-{p.engine.name}-{p.new.short}"
    return reports / f"{stem}.md", reports / f"{stem}.json"


def write_report(reports: Path, p: Plan, out: Outcome) -> tuple[Path, Path]:
    reports.mkdir(parents=True, exist_ok=True)
    md, js = report_paths(reports, p)
    write_atomic(js, json.dumps(to_json(p, out), indent=2) + "\n")
    write_atomic(md, markdown(p, out))
    return md, js


__all__ = ["Outcome", "markdown", "report_paths", "to_json", "write_report"]
