"""What a verify run found, and how it is shown: the report model (frozen, typed values),
its JSON and Markdown files, and the console table.

A `Case` is one prompt in one mode; a `MethodResult` holds a method's cases and draft
counts; an `Envelope` is the oracle tier's allowance; a `VerifyReport` is one tier of one
run. proof.verify builds them; `write` and `print_table` show them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec.models.methods import PLAIN
from llamaspec.proof import traffic_report
from llamaspec.proof.traffic_report import Traffic

# The two modes a method runs in, and the plain configurations that calibrate each one's
# envelope: a speculative run on parallel slots verifies drafts in multi-token batches as
# the sequential micro-batch configurations do, and more (CI, draft-measure test: the
# embedded Q4 model's "#include <" ties five ways; parallel slots alone calibrated 0.30
# nats for that prompt, micro-batch 4 0.83, and speculation on parallel slots emitted the
# fourth choice 0.45 nats behind).
MODES = ("sequential", "parallel")
CALIBRATES = {"sequential": ("sequential",), "parallel": ("sequential", "parallel")}

# What a case can be: identical | different | short | longer | known-defect | over-envelope
# | within | error (a request under traffic the server answered with an error). The
# failures among them:
FAILED_KINDS = ("different", "short", "longer", "over-envelope", "error")


@dataclass(frozen=True)
class Flip:
    """One emitted token that is not the oracle's choice, and why it passed (or did not)."""

    position: int  # the token's index in the output
    token: int
    text: str
    chosen: int  # the oracle's choice
    chosen_text: str
    gap: float  # nats; inf outside the oracle's top-k
    rank: int | None  # the token's rank among the oracle's top-k; None outside it
    allowed: str  # envelope (this prompt and mode's own) | near-tie | over


@dataclass(frozen=True)
class Case:
    """One prompt in one mode: how the speculative output compares with the reference."""

    prompt: str
    mode: str
    kind: str  # identical | different | short | longer | known-defect | over-envelope | within
    position: int | None = None
    max_gap: float | None = None
    over: list[str] = field(default_factory=list)  # tokens over the envelope, described
    reference: str = ""
    speculative: str = ""
    defect: str | None = None
    note: str = ""  # why a catalogued short-output defect does not excuse it
    envelope: float | None = None  # oracle tier: this prompt and mode's envelope, as judged
    flips: list[Flip] = field(default_factory=list)  # oracle tier: every token not its choice


@dataclass(frozen=True)
class MethodResult:
    """One method's cases in every mode it ran, and what it drafted and had accepted."""

    method: str
    argv: tuple[str, ...]
    skipped: str | None = None
    cases: tuple[Case, ...] = ()
    drafted: int = 0
    accepted: int = 0
    per_mode: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (drafted, accepted)
    flags: str = "determinism"  # or "own": the recipe's own flags, no determinism flags
    # the build refused speculation on more than one slot: sequential on one, parallel not run
    one_slot: bool = False
    traffic: tuple[Traffic, ...] = ()  # the traffic mode's servers, one per slot count

    def modes(self) -> list[str]:
        """The modes its cases ran in: sequential, parallel, then traffic by slot count."""
        seen = {c.mode for c in self.cases}
        return [m for m in MODES if m in seen] + [t.mode for t in self.traffic]

    def drafts(self, mode: str) -> tuple[int, int]:
        d, a = self.per_mode.get(mode, (0, 0))
        return d, a

    def count(self, kind: str, mode: str | None = None) -> int:
        return sum(1 for c in self.cases if c.kind == kind and mode in (None, c.mode))

    @property
    def failures(self) -> list[Case]:
        return [c for c in self.cases if c.kind in FAILED_KINDS]

    def max_gap(self, mode: str | None = None) -> float | None:
        gaps = [c.max_gap for c in self.cases if c.max_gap is not None and mode in (None, c.mode)]
        return max(gaps) if gaps else None


@dataclass(frozen=True)
class EnvelopeFailure:
    """An envelope configuration that crashed the server (skipped, its log kept)."""

    config: str
    error: str
    log: str


@dataclass(frozen=True)
class Envelope:
    """The plain output's own largest per-token gap under shape-only configurations.

    An output is judged against its own prompt's envelope in its own mode (`allowance`):
    the largest gap the plain outputs of that prompt showed under the configurations that
    calibrate that mode (`modes`, CALIBRATES), so no other prompt of the run moves it. `max_gap` and
    `by_config` summarize the whole run. `noise`: per prompt, how far the gap of a token
    among the first choices moved between two evaluations of the same prefix (one token at a
    time and batched, proof.envelope.noise); a token whose gap is within it passes whatever
    the envelope (a near-tie: a flip the evaluation's own noise can make). `near_tie`: the
    largest of them (the allowance where a prompt's noise was not measured)."""

    configs: tuple[str, ...]
    max_gap: float
    by_config: Mapping[str, float] = field(default_factory=dict)
    failures: tuple[EnvelopeFailure, ...] = ()
    by_prompt: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # → config → gap
    modes: Mapping[str, str] = field(default_factory=dict)  # config → the mode it calibrates
    near_tie: float = 0.0
    noise: Mapping[str, float] = field(default_factory=dict)  # prompt → nats

    def near_tie_for(self, prompt: str) -> float:
        """The near-tie allowance of `prompt`: its measured noise."""
        return self.noise.get(prompt, self.near_tie)

    def allowance(self, prompt: str, mode: str) -> float:
        """The envelope an output of `prompt` in `mode` is judged against (the whole run's
        largest gap for an envelope measured before envelopes were per prompt)."""
        if not self.by_prompt:
            return self.max_gap
        gaps = self.by_prompt.get(prompt, {})
        within = CALIBRATES[mode]
        return max((g for c, g in gaps.items() if self.modes.get(c) in within), default=0.0)


@dataclass(frozen=True)
class VerifyReport:
    """One tier of one verify run."""

    artifact_id: str
    tag: str
    tier: str
    model: str
    methods: tuple[MethodResult, ...]
    envelope: Envelope | None = None
    reference_sha256: str | None = None
    oracle_requests: int = 0
    wall_seconds: float = 0.0
    server: tuple[str, ...] = ()  # the plain server's command line
    # The determinism flags every server used (rows with flags "own" excepted); () when the
    # run used the server's defaults, None where not recorded.
    determinism: tuple[str, ...] | None = None

    @property
    def passed(self) -> bool:
        ran = [m for m in self.methods if m.skipped is None]
        return bool(ran) and all(not m.failures for m in ran)

    def to_json(self) -> dict:
        out = asdict(self)
        out["passed"] = self.passed
        for m, mj in zip(self.methods, out["methods"], strict=True):
            mj["summary"] = {
                mode: {
                    "identical": m.count("identical", mode),
                    "failed": sum(1 for c in m.failures if c.mode == mode),
                    "max_gap": _finite(m.max_gap(mode)),
                }
                for mode in m.modes()
            }
            mj["identical"] = m.count("identical")
            mj["failed"] = len(m.failures)
        out["own_flags"] = own_flags_summary(self)
        return _json_safe(out)  # type: ignore[return-value]


FLAG_LABELS = {"determinism": "determinism flags", "own": "recipe's own flags"}


ONE_SLOT_NOTE = (
    "not run: this build refuses speculation on more than one server slot (it started "
    "with -np 1 only)"
)


def _label(m: MethodResult) -> str:
    """A method as reports name it: rows under the recipe's own flags say so."""
    return m.method if m.flags == "determinism" else f"{m.method} ({FLAG_LABELS[m.flags]})"


def _under_test(method: str) -> str:
    """What a report calls the output compared with the reference."""
    return "control (no speculation)" if method == PLAIN.name else "speculative"


def own_flags_summary(report: VerifyReport) -> dict | None:
    """What the recipe's own flags (the server's defaults) changed, in the oracle's terms:
    outputs identical to the reference, within the envelope, over it; None without such rows."""
    own = [m for m in report.methods if m.flags == "own" and m.skipped is None]
    if not own:
        return None
    cases = [c for m in own for c in m.cases]
    failed = sum(len(m.failures) for m in own)
    gaps = [g for g in (m.max_gap() for m in own) if g is not None]
    return {
        "outputs": len(cases),
        "identical": sum(1 for c in cases if c.kind == "identical"),
        "within_envelope": sum(1 for c in cases if c.kind == "within"),
        "over_envelope": sum(1 for c in cases if c.kind == "over-envelope"),
        "other_failures": failed - sum(1 for c in cases if c.kind == "over-envelope"),
        "max_gap": _finite(max(gaps)) if gaps else None,
        "envelope": round(report.envelope.max_gap, 4) if report.envelope else None,
        "verdict": "failed" if failed else "passed",
    }


def _finite(x: float | None) -> float | str | None:
    if x is None:
        return None
    return "outside top-10" if math.isinf(x) else round(x, 4)


def _json_safe(obj: object) -> object:
    """JSON values: an infinite gap as "inf", tuples as lists."""
    if isinstance(obj, float) and math.isinf(obj):
        return "inf"
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def write(report: VerifyReport, out_dir: Path) -> None:
    """verify-<artifact>-<tag>.json and .md into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"verify-{report.artifact_id}-{report.tag}"
    stem.with_name(stem.name + ".json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))


def _note_row(label: str, mode: str, note: str, width: int) -> str:
    """A table row of `width` columns with only the method, the mode and the note filled."""
    return "| " + " | ".join([label, mode, *[""] * (width - 3), note]) + " |"


def markdown(report: VerifyReport) -> str:
    lines = [f"# Equivalence ({report.tier} tier): {report.artifact_id} ({report.model})", ""]
    if report.tier == "strict":
        lines += [
            "Reference copy in F32"
            + (f" (sha256 `{report.reference_sha256[:16]}…`)" if report.reference_sha256 else "")
            + ": greedy output with speculation must be token-identical to output without it.",
            *flags_lines(report),
            "",
            "| method | mode | identical | failed | known defect | drafted | accepted | note |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        env = report.envelope
        assert env is not None
        lines += [
            f"Envelope (no speculation; {', '.join(env.configs)}): max per-token gap "
            f"{env.max_gap:.3f} nats ({', '.join(f'{k}: {v}' for k, v in env.by_config.items())}); "
            f"{report.oracle_requests} oracle requests.",
            *envelope_lines(env),
            *flags_lines(report),
            "",
            *(
                f"Envelope configuration **{f.config}** crashed the server and was skipped: "
                f"{f.error} (log: `{f.log}`)."
                for f in env.failures
            ),
            "",
            "| method | mode | identical | within envelope | over envelope | max gap | drafted | "
            "accepted | note |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    width = lines[-1].count("|") - 1  # the table's columns, from its header's rule
    for m in report.methods:
        if m.skipped:
            lines.append(_note_row(_label(m), "–", m.skipped, width))
            continue
        if m.one_slot:
            lines.append(_note_row(_label(m), "parallel", ONE_SLOT_NOTE, width))
        for mode in m.modes():
            if report.tier == "strict":
                failed = sum(1 for c in m.failures if c.mode == mode)
                d, a = m.drafts(mode)
                lines.append(
                    f"| {_label(m)} | {mode} | {m.count('identical', mode)} | {failed} | "
                    f"{m.count('known-defect', mode)} | {d} | {a} | "
                    f"{'one slot (-np 1)' if m.one_slot else ''} |"
                )
            else:
                gap = _finite(m.max_gap(mode))
                d, a = m.drafts(mode)
                lines.append(
                    f"| {_label(m)} | {mode} | {m.count('identical', mode)} | "
                    f"{m.count('within', mode)} | {m.count('over-envelope', mode)} | {gap} | "
                    f"{d} | {a} | |"
                )
    if report.server:
        lines += [
            "",
            f"Plain server: `{' '.join(report.server)}`; each method adds its arguments:",
            "",
            *(
                f"- {_label(m)}: `{' '.join(m.argv) or '(none)'}`"
                + (" (without the determinism flags)" if m.flags == "own" else "")
                for m in report.methods
                if not m.skipped
            ),
        ]
    lines += traffic_report.lines([(_label(m), m.traffic) for m in report.methods])
    own = own_flags_lines(report)
    if own:
        lines += ["", "## Recipe's own flags vs determinism flags", "", *own]
    lines += flips_lines(report)
    for m in report.methods:
        who = _under_test(m.method)
        for c in m.cases:
            if c.kind in ("identical", "within"):
                continue
            lines += [
                "",
                f"## {_label(m)} / {c.prompt} ({c.mode}): {c.kind} at token {c.position}",
                "",
            ]
            if c.defect:
                lines.append(f"- known defect: {c.defect}")
            if c.note:
                lines.append(f"- {c.note}")
            lines += [f"- reference: `{c.reference}`", f"- {who}: `{c.speculative}`"]
            if c.max_gap is not None:
                lines.append(f"- largest per-token gap of the {who} output: {_finite(c.max_gap)}")
            lines += [f"- {o}" for o in c.over]
    lines += [
        "",
        f"Result: {'PASSED' if report.passed else 'FAILED'} in {report.wall_seconds:.0f}s.",
    ]
    return "\n".join(lines) + "\n"


def envelope_lines(env: Envelope) -> list[str]:
    """How the envelope judges: per prompt and mode, and near-ties (nothing for an envelope
    measured before envelopes were per prompt)."""
    if not env.by_prompt:
        return []
    for_mode = {m: [c for c in env.configs if env.modes.get(c) in CALIBRATES[m]] for m in MODES}
    return [
        "",
        "Each output is judged against its own prompt's envelope in its own mode: the largest "
        "gap that prompt's plain outputs showed under that mode's configurations (sequential: "
        f"{', '.join(for_mode['sequential']) or 'none'}; parallel: "
        f"{', '.join(for_mode['parallel']) or 'none'}), whatever other prompts the run holds. "
        "(a speculative run on parallel slots verifies drafts in multi-token batches as the "
        "micro-batch configurations do, so its mode includes theirs). A token over it still "
        "passes as a near-tie when its gap is within its prompt's measured noise: how far the "
        "gap of a first-choice token moved between evaluating the same prefix one token at a "
        "time (plain decoding) and batched (the oracle's prefixes), the largest over the "
        f"prompt's plain output (up to {env.near_tie:.3f} nats here); any other token over it "
        "fails.",
        "",
        "| prompt | sequential | parallel | near-tie (noise) |",
        "|---|---|---|---|",
        *(
            f"| {p} | {_finite(env.allowance(p, 'sequential'))} | "
            f"{_finite(env.allowance(p, 'parallel'))} | "
            f"{_finite(round(env.near_tie_for(p), 4))} |"
            for p in env.by_prompt
        ),
    ]


def _cell(text: str) -> str:
    """A token's text in a Markdown table cell: visible whitespace, no column breaks."""
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    return "`" + shown.replace("|", "\\|").replace("`", "'") + "`" if shown else ""


def flips_lines(report: VerifyReport) -> list[str]:
    """Every token the oracle would not have chosen, passed or not, one row each."""
    rows = [
        f"| {_label(m)} | {c.prompt} | {c.mode} | {c.kind} | {f.position} | {_cell(f.text)} "
        f"(id {f.token}) | {_cell(f.chosen_text)} (id {f.chosen}) | {_finite(f.gap)} | "
        f"{f.rank or '>10'} | {_finite(c.envelope)} | {f.allowed} |"
        for m in report.methods
        for c in m.cases
        for f in c.flips
    ]
    if report.tier != "oracle" or not rows:
        return []
    passed = sum(1 for m in report.methods for c in m.cases for f in c.flips if f.allowed != "over")
    return [
        "",
        "## Tokens the oracle would not have chosen",
        "",
        f"{len(rows)} emitted tokens differ from the oracle's choice for their prefix; "
        f"{passed} passed (within their prompt and mode's envelope, or a near-tie), "
        f"{len(rows) - passed} did not. Token index counts from the output's first token; the "
        "gap is in nats, the rank among the oracle's top-10.",
        "",
        "| method | prompt | mode | output | token | emitted | oracle's choice | gap | rank | "
        "envelope | passed as |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def flags_lines(report: VerifyReport) -> list[str]:
    """Which server flags the report's claim holds under (nothing where not recorded)."""
    det = report.determinism
    if det is None:
        return []
    if not det:
        return [
            "",
            "Server defaults, no determinism flags (`--server-defaults`): exactness is not "
            "claimed here; a difference measures what the defaults change, with its gaps.",
        ]
    flags = f"`{' '.join(det)}`"
    if report.tier == "strict":
        text = (
            f"Exact under the determinism flags {flags}, which every server of this run uses "
            "(one KV cache per slot, flash attention off); with the server's defaults "
            "exactness is not claimed."
        )
    else:
        text = f"Reference, envelope and oracle run under the determinism flags {flags}" + (
            "; the rows under the recipe's own flags run without them."
            if any(m.flags == "own" for m in report.methods)
            else "."
        )
    return ["", text]


def own_flags_lines(report: VerifyReport) -> list[str]:
    """What the recipe's own flags changed against the same reference and envelope."""
    s = own_flags_summary(report)
    if s is None:
        return []
    det = " ".join(report.determinism or []) or "the determinism flags"
    if s["verdict"] == "failed":
        verdict = (
            "FAILED: under its own flags the recipe emits tokens the oracle puts over the "
            "envelope (details below)."
        )
    elif s["within_envelope"]:
        verdict = (
            "Passed: what the defaults change stays within the envelope, the numerics of "
            "other kernel shapes, not a failure."
        )
    else:
        verdict = "Passed: the defaults changed no output here."
    return [
        f"Under the determinism flags (`{det}`) the recipe ran as the strict tier needs it to "
        "be exact. Under the recipe's own flags it ran the way `serve` runs it: the "
        "server's defaults for the rest, no determinism flags. Against the same reference "
        + (
            "and the same envelopes (per prompt and mode, the largest "
            f"{s['envelope']} nats; near-ties within the measured noise, up to "
            f"{report.envelope.near_tie:.3f} nats): "
            if report.envelope is not None and report.envelope.by_prompt
            else f"and envelope ({s['envelope']} nats): "
        )
        + f"{s['identical']} of {s['outputs']} outputs identical, "
        f"{s['within_envelope']} within the envelope, {s['over_envelope']} over it"
        + (f", {s['other_failures']} cut short or failed otherwise" if s["other_failures"] else "")
        + f"; the largest per-token gap {s['max_gap']} nats.",
        "",
        verdict,
    ]


def print_table(report: VerifyReport, console: Console) -> None:
    table = Table(title=f"verify ({report.tier}): {report.artifact_id} ({report.model})")
    own = any(m.flags == "own" for m in report.methods)
    cols = ["method", *(["flags"] if own else []), "mode", "identical"]
    cols += ["failed", "known defect"] if report.tier == "strict" else ["within", "over", "max gap"]
    for col in (*cols, "drafted", "accepted", "note"):
        table.add_column(col)
    for m in report.methods:
        first = [m.method, *([m.flags] if own else [])]
        if m.skipped:
            table.add_row(*first, "–", *[""] * (len(cols) - len(first) - 1), "", "", m.skipped)
            continue
        if m.one_slot:
            blank = [""] * (len(cols) - len(first) - 1)
            table.add_row(*first, "parallel", *blank, "", "", ONE_SLOT_NOTE)
        for mode in m.modes():
            if report.tier == "strict":
                extra = [
                    str(sum(1 for c in m.failures if c.mode == mode)),
                    str(m.count("known-defect", mode)),
                ]
            else:
                extra = [
                    str(m.count("within", mode)),
                    str(m.count("over-envelope", mode)),
                    str(_finite(m.max_gap(mode))),
                ]
            silent = next((t.silent_slots for t in m.traffic if t.mode == mode), [])
            table.add_row(
                *first,
                mode,
                str(m.count("identical", mode)),
                *extra,
                *map(str, m.drafts(mode)),
                f"slots {silent} never accepted" if silent else "",
            )
    console.print(table)
    for line in (*flags_lines(report), *own_flags_lines(report)):
        console.print(f"  {line}" if line else "", markup=False)
    for m in report.methods:
        who = _under_test(m.method)
        for c in m.cases:
            if c.kind not in ("identical", "within"):
                console.print(
                    f"  {_label(m)}/{c.prompt} ({c.mode}): {c.kind} at token {c.position}"
                    + (f" — {c.defect}" if c.defect else "")
                )
                if c.note:
                    console.print(f"    {c.note}")
                if c.kind != "known-defect":
                    console.print(f"    reference: {c.reference}\n    {who}: {c.speculative}")
    flips = [f for m in report.methods for c in m.cases for f in c.flips]
    if flips:
        passed = [f for f in flips if f.allowed != "over"]
        near = sum(1 for f in passed if f.allowed == "near-tie")
        console.print(
            f"  {len(flips)} emitted tokens differ from the oracle's choice: {len(passed)} "
            f"passed ({near} as near-ties), {len(flips) - len(passed)} over; each is listed in "
            "the Markdown report"
        )
    console.print(f"verify: {'PASSED' if report.passed else 'FAILED'} ({report.wall_seconds:.0f}s)")
