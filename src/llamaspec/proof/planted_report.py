"""What an oracle-power run found (proof.planted) and how it is shown: the planted and
clean outputs as frozen values, the detection and false-alarm rates, and
oracle-power-<artifact>[-short].json and .md."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from llamaspec.proof.verify_report import FAILED_KINDS, Envelope

DEFECTS = {
    "random-acceptance": "drafts accepted by coin flip (synthetic acceptance, n-gram drafts "
    "of 4 tokens, position i accepted with probability 0.5^(i+1))",
    "accept-one-too-many": "each round also accepts the first rejected draft token (n-gram "
    "drafts over the context)",
    "rank-2": "one token swapped for the target's 2nd choice, the server continuing after it",
    "rank-3": "one token swapped for the target's 3rd choice, the server continuing after it",
    "rank-10": "one token swapped for the target's 10th choice, the server continuing after it",
    "outside-top-10": "one token swapped for a token outside the target's top 10",
    "slot-2-of-4": "on 4 parallel slots, only the 2nd request's output takes, at its middle, "
    "a token of another slot's output outside its own top 10, the server continuing after it",
}

GOAL_ORACLE = 0.95  # the oracle's detection goal on defects that are not true near-ties
# The rule before issue 52: a token of the oracle's first three choices within 1.0 nat passed.
LEGACY_RANK, LEGACY_NATS = 3, 1.0


@dataclass(frozen=True)
class Planted:
    """One planted output and the verdicts on it."""

    defect: str
    prompt: str
    mode: str
    position: int | None  # the first token that differs from plain decoding (None: none)
    token_gap: float | None  # that token's gap in plain decoding's own top-k (inf: outside)
    near_tie: bool  # within the prompt's measured noise: noise alone could have chosen it
    strict_failed: bool
    oracle_failed: bool  # the oracle as verify runs it (near-ties within measured noise)
    legacy_failed: bool  # the rule before it (first three choices within 1.0 nat)
    oracle_kind: str

    @property
    def expressed(self) -> bool:
        """The plant changed the output (a coin or a drafter may leave it as plain's)."""
        return self.position is not None


@dataclass(frozen=True)
class Clean:
    """One clean speculative output judged by the oracle (a failure is a false alarm)."""

    method: str
    prompt: str
    mode: str
    kind: str

    @property
    def false_alarm(self) -> bool:
        return self.kind in FAILED_KINDS


@dataclass(frozen=True)
class PowerRun:
    """Everything the report shows."""

    artifact_id: str
    model: str
    prompts: tuple[str, ...]
    envelope: Envelope
    planted: tuple[Planted, ...]
    clean: tuple[Clean, ...]
    oracle_requests: int
    wall_seconds: float
    short: bool


def rates(run_: PowerRun) -> dict[str, float | int | None]:
    """The headline numbers: detection by each tier and the oracle's false-alarm rate."""
    expressed = [p for p in run_.planted if p.expressed]
    hard = [p for p in expressed if not p.near_tie]

    def share(n: int, d: int) -> float | None:
        return round(n / d, 4) if d else None

    alarms = sum(c.false_alarm for c in run_.clean)
    return {
        "planted": len(run_.planted),
        "expressed": len(expressed),
        "strict_detected": sum(p.strict_failed for p in expressed),
        "strict_rate": share(sum(p.strict_failed for p in expressed), len(expressed)),
        "near_ties": len(expressed) - len(hard),
        "oracle_detected": sum(p.oracle_failed for p in hard),
        "oracle_rate": share(sum(p.oracle_failed for p in hard), len(hard)),
        "legacy_detected": sum(p.legacy_failed for p in hard),
        "legacy_rate": share(sum(p.legacy_failed for p in hard), len(hard)),
        "clean": len(run_.clean),
        "false_alarms": alarms,
        "false_alarm_rate": share(alarms, len(run_.clean)),
    }


def goals_met(run_: PowerRun) -> bool:
    r = rates(run_)
    return r["strict_rate"] == 1.0 and (r["oracle_rate"] or 0.0) >= GOAL_ORACLE


def _pct(x: float | int | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _gap(g: float | None) -> str:
    if g is None:
        return "—"
    return "outside top-10" if math.isinf(g) else f"{g:.3f}"


def to_json(run: PowerRun) -> dict:
    out = asdict(run)
    for p in out["planted"]:
        if p["token_gap"] is not None and math.isinf(p["token_gap"]):
            p["token_gap"] = "inf"
    out["rates"] = rates(run)
    out["goals"] = {"strict_rate": 1.0, "oracle_rate": GOAL_ORACLE, "met": goals_met(run)}
    return out


def markdown(run: PowerRun) -> str:
    r = rates(run)
    env = run.envelope
    lines = [
        f"# Oracle power: `{run.artifact_id}` on {run.model}",
        "",
        "Defects planted into real outputs of the server (`llamaspec maint oracle-power"
        + (" --short" if run.short else "")
        + "`), each output judged by the strict tier (token-identical to plain decoding) and "
        "by the oracle tier exactly as `verify --tier oracle` judges it: the envelope of "
        "its prompt and mode, and near-ties within the prompt's measured noise (how far a "
        "first choice's gap moved between decoding one token at a time and the oracle's "
        "batched prefixes). The column *before* applies the rule the oracle had until "
        f"then (a token of its first three choices within {LEGACY_NATS} nat passed). A "
        "planted output is a *true near-tie* when every wrong token the plant made is within "
        "that prompt's measured noise, at its gap where it was planted (plain decoding's own "
        "top-10 for a swap, the target's for another slot's token or a draft token accepted "
        "too many; for coin-flip acceptance, whose wrong tokens only the engine knows, the "
        "first token that differs from plain decoding): noise alone could have chosen it. "
        "Detection rates count outputs the plant changed.",
        "",
        f"- **verdict: {'goals met' if goals_met(run) else 'GOALS MISSED'}** (strict 100 %; "
        f"oracle ≥ {100 * GOAL_ORACLE:.0f} % of outputs that are not true near-ties)",
        f"- strict tier: {r['strict_detected']} of {r['expressed']} failed "
        f"({_pct(r['strict_rate'])})",
        f"- oracle tier: {r['oracle_detected']} of {r['expressed'] - r['near_ties']} that are "
        f"not true near-ties failed ({_pct(r['oracle_rate'])}); before: "
        f"{r['legacy_detected']} ({_pct(r['legacy_rate'])}); true near-ties: {r['near_ties']}",
        f"- false alarms on clean speculative outputs of the same quantized target: "
        f"{r['false_alarms']} of {r['clean']} ({_pct(r['false_alarm_rate'])})",
        f"- {len(run.prompts)} prompts; {run.oracle_requests} oracle requests; "
        f"{run.wall_seconds / 60:.1f} min",
        "",
        "## By defect",
        "",
        "| defect | planted as | outputs | changed | strict failed | true near-ties | "
        "oracle failed (now) | oracle failed (before) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, what in DEFECTS.items():
        mine = [p for p in run.planted if p.defect == name]
        if not mine:
            continue
        changed = [p for p in mine if p.expressed]
        hard = [p for p in changed if not p.near_tie]
        lines.append(
            f"| {name} | {what} | {len(mine)} | {len(changed)} | "
            f"{sum(p.strict_failed for p in changed)} | {len(changed) - len(hard)} | "
            f"{sum(p.oracle_failed for p in hard)} of {len(hard)} | "
            f"{sum(p.legacy_failed for p in hard)} of {len(hard)} |"
        )
    lines += [
        "",
        "## Allowances per prompt (nats)",
        "",
        "| prompt | envelope, sequential | envelope, parallel | measured noise (near-ties) |",
        "|---|---|---|---|",
        *(
            f"| {p} | {env.allowance(p, 'sequential'):.3f} | {env.allowance(p, 'parallel'):.3f} "
            f"| {env.near_tie_for(p):.3f} |"
            for p in run.prompts
        ),
        "",
        "## Clean runs (false alarms)",
        "",
        "| method | mode | outputs | identical | within | failed |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], Counter] = {}
    for c in run.clean:
        groups.setdefault((c.method, c.mode), Counter())[c.kind] += 1
    for (method, mode), n in groups.items():
        failed = sum(v for k, v in n.items() if k not in ("identical", "within"))
        lines.append(
            f"| {method} | {mode} | {sum(n.values())} | {n['identical']} | {n['within']} | "
            f"{failed} |"
        )
    lines += [
        "",
        "## Every planted output",
        "",
        "| defect | prompt | mode | first wrong token | gap (largest planted) | true near-tie | "
        "strict | "
        "oracle (now) | oracle (before) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in run.planted:
        lines.append(
            f"| {p.defect} | {p.prompt} | {p.mode} | "
            f"{'unchanged' if p.position is None else p.position} | {_gap(p.token_gap)} | "
            f"{'yes' if p.near_tie else 'no'} | {'failed' if p.strict_failed else 'passed'} | "
            f"{p.oracle_kind} | {'failed' if p.legacy_failed else 'passed'} |"
        )
    return "\n".join(lines) + "\n"


def write(run: PowerRun, out_dir: Path) -> tuple[Path, Path]:
    """oracle-power-<artifact>[-short].json and .md in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"oracle-power-{run.artifact_id}{'-short' if run.short else ''}"
    js, md = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    js.write_text(json.dumps(to_json(run), indent=2, default=str) + "\n")
    md.write_text(markdown(run))
    return js, md
