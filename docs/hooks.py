"""MkDocs hooks: add the generated reference (CLI pages) and the reports' index to the
site. The pages themselves come from `llamaspec.cli.reference`; the JSON Schemas are
committed files (docs/reference/schemas/, written by `nox -s schemas`)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

from llamaspec import env
from llamaspec.cli import reference

KINDS = {
    "bench": "Benchmarks",
    "tune": "Tuning",
    "limit": "Speculation ceiling (limit)",
    "load": "Load tests and soaks",
    "verify": "Equivalence (verify)",
    "gpu": "GPU acceptance",
    "build": "Build time",
    "reproducible": "Reproducible builds",
    "portable": "Portable builds",
    "docker": "Images",
    "bump": "Pin bumps",
    "health": "Build health",
    "bug": "Engine defects",
}


def _reports_index(docs: Path) -> str:
    out = ["# Reports", "", "Every report llamaspec's commands wrote and this repository keeps", ""]
    out[-2] += " (each beside its JSON and, where a picture helps, a PNG plot)."
    groups: dict[str, list[str]] = {}
    root = docs / "reports"
    # a report a command wrote into a folder of its own (--reports reports/NAME) is listed too
    for md in sorted([*root.glob("*.md"), *root.glob("*/*.md")]):
        title = next((ln[2:] for ln in md.read_text().splitlines() if ln.startswith("# ")), "")
        kind = md.name.split("-")[0]
        where = md.relative_to(root).as_posix()
        note = f" ({md.parent.name}/)" if md.parent != root else ""
        entry = f"- [{title or md.stem}]({where}){note}"
        groups.setdefault(KINDS.get(kind, "Other"), []).append(entry)
    for kind in [*KINDS.values(), "Other"]:
        if kind in groups:
            out += [f"## {kind}", "", *groups[kind], ""]
    return "\n".join(out)


def on_files(files: Files, config) -> Files:
    docs = Path(config["docs_dir"])
    generated = {**reference.cli_pages(), "reports/index.md": _reports_index(docs)}
    generated["reference/environment.md"] = env.markdown()  # from llamaspec/env.py's table
    for uri, text in generated.items():
        if files.get_file_from_path(uri) is not None:
            raise SystemExit(f"docs/{uri} is generated when the site is built: remove the file")
        files.append(File.generated(config, uri, content=text))
    return files


INCLUDE = re.compile(r"<!-- include-report: ([\w.-]+\.md) -->")


def _included(match: re.Match, docs: Path) -> str:
    """A committed report's body (its title left out, its headings one level down) in place
    of `<!-- include-report: NAME.md -->`; a note where none is committed yet."""
    path = docs / "reports" / match.group(1)
    if not path.is_file():
        return f"*No `{match.group(1)}` is committed yet: the matrix appears here once it is.*"
    lines = path.read_text(encoding="utf-8").splitlines()
    body = lines[1:] if lines and lines[0].startswith("# ") else lines
    return "\n".join("#" + ln if ln.startswith("#") else ln for ln in body)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The `fact:` markers are for the docs tests (see tests/unit/test_docs_facts.py), not
    for readers: leave them out of the HTML. An include-report marker becomes the report."""
    markdown = INCLUDE.sub(lambda m: _included(m, Path(config["docs_dir"])), markdown)
    return re.sub(r"<!-- fact: .*? -->", "", markdown)
