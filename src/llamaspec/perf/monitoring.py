"""Prometheus alert rules, their `promtool test rules` file, a scrape config and a Grafana
dashboard for a recipe's llama-server (`llamaspec recipe monitor RECIPE --out DIR`).

The templates ship in the package (perf/monitoring_templates/: alerts.yml, dashboard.json);
`render` fills them in for one recipe and engine and keeps only what makes sense there:

- LlamaServerDown (`up == 0`) and LlamaSpecRequestsDeferred (requests waiting for a slot):
  every recipe;
- LlamaSpecAcceptanceLow (the acceptance rate over a window below a fraction of the
  recipe's baseline): where the engine exports speculation counters (upstream llama.cpp;
  ik_llama.cpp exports none, runtime/metrics.py);
- LlamaSpecDraftIdle (tokens generated, nothing drafted): where the recipe also loads a
  draft model or MTP heads. N-gram drafts come from repeats in the text, so an n-gram
  recipe that drafts nothing for a while is not a fault and gets no such alert.

The baseline is the recipe's measured acceptance and speedup from its newest bench report
(perf/monitoring_baseline.py); without one, a value the user gives, else an assumed one,
and the rendered files say which. It lives in perf/ because it reads recipes (models/) and
bench reports (perf/); images/run_line.py adds the Prometheus service to a compose file
with `compose_prometheus`.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.netaddr import AddressError, check_endpoint
from llamaspec.perf.monitoring_baseline import Baseline, find_baseline, given_baseline
from llamaspec.perf.monitoring_write import write_files

RULES = "llamaspec-alerts.yml"
RULES_TEST = "llamaspec-alerts.test.yml"
SCRAPE = "prometheus.yml"
SCRAPE_COMPOSE = "prometheus-compose.yml"
DASHBOARD = "grafana-dashboard.json"
RECORD = "llamaspec-monitoring.json"
FILES = (RULES, RULES_TEST, SCRAPE, SCRAPE_COMPOSE, DASHBOARD, RECORD)

DOWN, DEFERRED, IDLE, LOW, BUSY = (
    "LlamaServerDown",
    "LlamaSpecRequestsDeferred",
    "LlamaSpecDraftIdle",
    "LlamaSpecAcceptanceLow",
    "LlamaSpecAboveCrossover",
)
ALERTS = (DOWN, DEFERRED, IDLE, LOW, BUSY)
# each alert's `for:` by default (Settings.hold overrides them all)
DEFAULT_FOR = {DOWN: "1m", DEFERRED: "5m", IDLE: "5m", LOW: "15m", BUSY: "15m"}
# engines whose llama-server exports llamacpp:spec_decode_* (runtime/metrics.py)
COUNTING_ENGINES = frozenset({"llama.cpp"})
# draft tokens a window needs before its acceptance is judged (a few drafts say little)
MIN_DRAFTED = 50
# the Prometheus image the compose rendering runs beside the server
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"
CONTAINER_DIR = "/etc/prometheus/llamaspec"

_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")  # whole: no blank, no newline around it
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def seconds(text: str, what: str) -> float:
    """A Prometheus duration (`30s`, `10m`, `1h`; one unit) in seconds, or one paragraph.
    Nothing around it is stripped: the text goes as it is into the rules and comments."""
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise LlamaspecError(
            f"{what} {text!r} is not a Prometheus duration: give a whole number and one unit "
            "(ms, s, m, h, d or w), with no blank or newline, e.g. 30s, 10m or 1h."
        )
    return int(m.group(1)) * _UNITS[m.group(2)]


def check_target(target: str) -> str:
    """`--target` unchanged when it is strictly HOST:PORT (a host name, an IPv4 address or
    an [IPv6] one, and a port of 1-65535): it goes into the scrape config and, as a label
    value, into the promtool tests, so a quote, a brace or a newline would change them."""
    try:
        return check_endpoint(target)
    except AddressError:
        raise LlamaspecError(
            f"--target {target!r} is not HOST:PORT, the address Prometheus scrapes the server "
            "at: a host name, an IPv4 address or an [IPv6] one, a colon and a port of 1-65535, "
            "with no blank, quote or brace (e.g. 127.0.0.1:8080, llama-server:8080, [::1]:8080)."
        ) from None


def check_folder(folder: Path, what: str) -> Path:
    """`folder` unchanged when its path holds no control character (a newline in it would
    end a line of the compose file it is written into)."""
    text = str(folder)
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise LlamaspecError(
            f"{what} {text!r} holds a control character (a newline, a tab, an escape, a "
            "line or bidi mark): its path is written into the compose file. Rename the "
            "folder, or give another one."
        )
    return folder


@dataclass(frozen=True)
class Settings:
    """How the rules judge: `window` (the range each rate is taken over), `fraction` (of the
    baseline acceptance below which acceptance is low), `hold` (every alert's `for:`; None:
    each alert's default, DEFAULT_FOR), `scrape_interval`, the server's `target`
    (host:port as Prometheus reaches it) and `job` (default: llamaspec-<recipe>)."""

    window: str = "10m"
    fraction: float = 0.5
    hold: str | None = None
    scrape_interval: str = "15s"
    target: str = "127.0.0.1:8080"
    job: str | None = None

    def check(self) -> None:
        window = seconds(self.window, "--window")
        scrape = seconds(self.scrape_interval, "--scrape-interval")
        if self.hold is not None:
            seconds(self.hold, "--for")
        if scrape <= 0 or window <= 0:
            raise LlamaspecError(
                f"--window {self.window} and --scrape-interval {self.scrape_interval} must be "
                "longer than zero."
            )
        if window < 2 * scrape:
            raise LlamaspecError(
                f"--window {self.window} is shorter than two scrapes (--scrape-interval "
                f"{self.scrape_interval}): a rate over it would have fewer than two samples "
                "and the speculation alerts could never fire. Give a window of at least four "
                "scrape intervals."
            )
        if not (isinstance(self.fraction, float | int) and 0 < self.fraction < 1):
            raise LlamaspecError(
                f"--fraction {self.fraction!r} is not between 0 and 1 (exclusive): it is the "
                "share of the baseline acceptance below which LlamaSpecAcceptanceLow fires, "
                "e.g. 0.5."
            )
        check_target(self.target)

    def for_(self, alert: str) -> str:
        return self.hold if self.hold is not None else DEFAULT_FOR[alert]


@dataclass(frozen=True)
class Rendering:
    """What `render` made for one recipe: the alerts it kept, those it left out (and why),
    the baseline, and each file's text by name (FILES)."""

    recipe: str
    engine: str
    job: str
    alerts: tuple[str, ...]
    omitted: tuple[tuple[str, str], ...]
    baseline: Baseline | None
    threshold: float | None
    files: Mapping[str, str] = field(default_factory=dict)


def choose_alerts(
    types: Sequence[str], engine: str, crossover: int | None = None
) -> tuple[list[str], list[tuple[str, str]]]:
    """The alerts that make sense for a recipe with spec `types` on `engine` (and its
    measured `crossover`, the client count where speculation loses), and why each other
    one is left out."""
    kept, omitted = [DOWN, DEFERRED], []
    if not types:
        why = "the recipe has no speculation"
        return kept, [(IDLE, why), (LOW, why), (BUSY, why)]
    if engine not in COUNTING_ENGINES:
        why = f"{engine}'s llama-server exports no speculation counters (/metrics)"
        omitted += [(IDLE, why), (LOW, why)]
    elif set(types) & dialects.DRAFTING_TYPES:
        kept += [IDLE, LOW]
    else:
        kept.append(LOW)
        omitted.append(
            (
                IDLE,
                f"spec types {', '.join(types)} draft from repeats in the text (no draft "
                "model or MTP heads), so a while without drafts is not a fault",
            )
        )
    if crossover is None:
        omitted.append((BUSY, "no crossover measured for this recipe (bench it at several "
                        "client counts), or speculation won at every count measured"))  # fmt: skip
    else:
        kept.append(BUSY)
    return kept, omitted


def _drafter(types: Sequence[str]) -> str:
    if "mtp" in types:
        return "the target's own MTP heads"
    return "a draft model" if set(types) & dialects.MODEL_TYPES else "a drafter"


def _fill(text: str, values: Mapping[str, str], what: str) -> str:
    """The template with its placeholders filled; each value escaped as inside a JSON
    string, which YAML's double-quoted strings read the same (a quote or backslash in a
    report's name cannot break either file)."""

    def one(m: re.Match) -> str:
        if m.group(1) not in values:
            raise LlamaspecError(f"The {what} template names @{m.group(1)}@, which is unknown.")
        return json.dumps(values[m.group(1)], ensure_ascii=False)[1:-1]

    return _PLACEHOLDER.sub(one, text)


def _template(name: str) -> str:
    return (resources.files("llamaspec.perf") / "monitoring_templates" / name).read_text()


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)


def render(
    recipe: str,
    types: Sequence[str],
    engine: str,
    settings: Settings,
    baseline: Baseline,
    crossover: tuple[int, str] | None = None,
) -> Rendering:
    """Every file for `recipe` (spec `types` after `engine`'s overrides) on `engine`;
    `crossover`: the client count where its speculation loses, and where that was measured."""
    settings.check()
    job = settings.job or f"llamaspec-{recipe}"
    kept, omitted = choose_alerts(types, engine, crossover[0] if crossover else None)
    spec = LOW in kept
    threshold = round(baseline.acceptance * settings.fraction, 4) if spec else None
    values = {
        "RECIPE": recipe,
        "JOB": job,
        "WINDOW": settings.window,
        "THRESHOLD": f"{threshold:g}" if threshold is not None else "0",
        "FRACTION": f"{settings.fraction:g}",
        "BASELINE": f"{baseline.acceptance:.3f}",
        "BASELINE_KIND": baseline.kind,
        "BASELINE_SOURCE": f"{baseline.kind}: {baseline.source}",
        "MIN_DRAFTED": str(MIN_DRAFTED),
        "DRAFTER": _drafter(types),
        "FOR_DOWN": settings.for_(DOWN),
        "FOR_DEFERRED": settings.for_(DEFERRED),
        "FOR_IDLE": settings.for_(IDLE),
        "FOR_ACCEPTANCE": settings.for_(LOW),
        "FOR_CROSSOVER": settings.for_(BUSY),
        "CROSSOVER": str(crossover[0]) if crossover else "0",
        "CROSSOVER_SOURCE": crossover[1] if crossover else "",
    }
    rules = yaml.safe_load(_fill(_template("alerts.yml"), values, "alerts.yml"))
    group = rules["groups"][0]
    group["rules"] = [r for r in group["rules"] if r["alert"] in kept]
    head = _header(recipe, engine, kept, omitted, baseline if spec else None, settings)
    files = {
        RULES: head + _dump(rules),
        RULES_TEST: head
        + _dump(_tests(group["rules"], job, settings, threshold, baseline, crossover)),
        SCRAPE: head + _dump(_scrape(job, settings, settings.target)),
        SCRAPE_COMPOSE: head + _dump(_scrape(job, settings, "llama-server:8080")),
        DASHBOARD: _dashboard(values, spec, head) + "\n",
    }
    record = {
        "recipe": recipe,
        "engine": engine,
        "job": job,
        "alerts": list(kept),
        "omitted": [{"alert": a, "why": w} for a, w in omitted],
        "baseline": asdict(baseline) | {"kind": baseline.kind} if spec else None,
        "threshold": threshold,
        "crossover": {"clients": crossover[0], "source": crossover[1]} if crossover else None,
        "settings": asdict(settings) | {"for": {a: settings.for_(a) for a in kept}},
        "files": sorted(files),
    }
    files[RECORD] = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    return Rendering(
        recipe, engine, job, tuple(kept), tuple(omitted), baseline if spec else None, threshold,
        files,
    )  # fmt: skip


def for_recipe(
    name: str,
    settings: Settings,
    *,
    engine: str | None = None,
    report: Path | None = None,
    acceptance: float | None = None,
    root: Path | None = None,
) -> Rendering:
    """`render` for the catalog recipe `name` on `engine` (default llama.cpp), its baseline
    from `find_baseline` (the project's reports/ and the user's reports folder)."""
    from llamaspec import config
    from llamaspec.errors import choose
    from llamaspec.models import recipes
    from llamaspec.paths import default_out, project_root

    root = root or project_root()
    settings.check()
    if acceptance is not None:
        given_baseline(acceptance)
    recipe, _ = recipes.find(name, root)
    engine = choose("engine", engine or "llama.cpp", config.load_engines(root))
    types = recipe.for_engine(engine).spec.types
    folders = [root / "reports", default_out("reports")]
    tuned_by = None
    if recipe.measured is not None and Path(recipe.measured.report).name.startswith("tune-"):
        tuned_by = root / recipe.measured.report
    baseline = find_baseline(recipe.name, engine, folders, root, report, acceptance, tuned_by)
    cross = recipe.measured.crossover if recipe.measured is not None else None
    where = (
        f"measured at {', '.join(map(str, cross.measured))} clients in {cross.report}"
        if cross is not None and cross.clients is not None
        else ""
    )
    crossover = (cross.clients, where) if cross is not None and cross.clients else None
    return render(recipe.name, types, engine, settings, baseline, crossover)


def _header(
    recipe: str,
    engine: str,
    kept: Sequence[str],
    omitted: Sequence[tuple[str, str]],
    baseline: Baseline | None,
    settings: Settings,
) -> str:
    lines = [
        f"Rendered by `llamaspec recipe monitor {recipe}` for engine {engine}.",
        f"Alerts: {', '.join(kept)}.",
    ]
    lines += [f"Left out: {alert}: {why}." for alert, why in omitted]
    if baseline is None:
        lines.append("No speculation alerts, so no acceptance baseline.")
    else:
        lines.append(f"Baseline: {baseline.describe()}.")
        if not baseline.measured:
            lines.append("The baseline is NOT MEASURED: bench the recipe to replace it.")
        lines.append(
            f"LlamaSpecAcceptanceLow fires below {settings.fraction:g} of it over "
            f"{settings.window}."
        )
    return "".join(f"# {line}\n" for line in lines)


def _scrape(job: str, settings: Settings, target: str) -> dict:
    return {
        "global": {
            "scrape_interval": settings.scrape_interval,
            "evaluation_interval": settings.scrape_interval,
        },
        "rule_files": [RULES],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}],
    }


def _dashboard(values: Mapping[str, str], spec: bool, head: str) -> str:
    notes = head.replace("# ", "").replace("\n", "  \n")
    filled = dict(values) | {"UID": "llamaspec-" + values["RECIPE"][:30], "NOTES": ""}
    board = json.loads(_fill(_template("dashboard.json"), filled, "dashboard.json"))
    panels = []
    for panel in board["panels"]:
        if panel.pop("llamaspec_needs", None) == "spec" and not spec:
            continue
        if panel["type"] == "text":
            panel["options"]["content"] = notes
        panels.append(panel)
    board["panels"] = panels
    return json.dumps(board, indent=2, ensure_ascii=False)


# --- the promtool test file: a firing and a quiet case for every alert -----------------------


def _expand(text: str, labels: Mapping[str, str], value: float | None) -> str:
    """An annotation as Prometheus expands it, for the forms the template uses:
    `{{ $labels.NAME }}` and `{{ $value | printf "%.2f" }}`."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    if value is not None:
        text = text.replace('{{ $value | printf "%.2f" }}', f"{value:.2f}")
    if "{{" in text:
        raise LlamaspecError(f"An annotation uses a template form the test renderer lacks: {text}")
    return text


def _tests(
    rules: Sequence[Mapping[str, Any]],
    job: str,
    settings: Settings,
    threshold: float | None,
    baseline: Baseline,
    crossover: tuple[int, str] | None = None,
) -> dict:
    step = settings.scrape_interval
    step_s = seconds(step, "--scrape-interval")
    instance = settings.target
    labels = {"job": job, "instance": instance}
    sel = f'{{job="{job}", instance="{instance}"}}'
    tests = []
    for rule in rules:
        alert = rule["alert"]
        hold = seconds(str(rule.get("for", "0s")), "for")
        window = seconds(settings.window, "--window") if alert in (IDLE, LOW, BUSY) else 0
        at = window + hold + 3 * step_s
        n = int(at // step_s) + 2
        when = f"{int(at)}s"
        cases: list[tuple[str, dict[str, str], float | None, bool]] = []
        if alert == DOWN:
            cases = [
                ("the target does not answer", {"up": f"0x{n}"}, None, True),
                ("the target answers", {"up": f"1x{n}"}, None, False),
            ]
        elif alert == DEFERRED:
            name = "llamacpp:requests_deferred"
            cases = [
                ("a request waits for a slot all along", {name: f"1x{n}"}, None, True),
                ("no request waits", {name: f"0x{n}"}, None, False),
            ]
        elif alert == IDLE:
            pred, drafted = (
                "llamacpp:tokens_predicted_total",
                ("llamacpp:spec_decode_num_draft_tokens_total"),
            )
            cases = [
                ("tokens are generated, none drafted", {pred: f"0+10x{n}", drafted: f"0x{n}"},
                 None, True),
                ("tokens are generated and drafted", {pred: f"0+10x{n}", drafted: f"0+5x{n}"},
                 None, False),
                ("nothing is generated", {pred: f"0x{n}", drafted: f"0x{n}"}, None, False),
            ]  # fmt: skip
        elif alert == LOW and threshold is not None:
            drafted, accepted = (
                "llamacpp:spec_decode_num_draft_tokens_total",
                "llamacpp:spec_decode_num_accepted_tokens_total",
            )
            low = max(math.floor(threshold * 50), 0)  # half the threshold, per 100 drafted
            good = min(math.ceil(baseline.acceptance * 100), 100)
            cases = [
                (f"{low} of every 100 drafted tokens accepted",
                 {drafted: f"0+100x{n}", accepted: f"0+{low}x{n}"}, low / 100, True),
                (f"{good} of every 100 drafted tokens accepted (the baseline)",
                 {drafted: f"0+100x{n}", accepted: f"0+{good}x{n}"}, None, False),
            ]  # fmt: skip
        elif alert == BUSY and crossover is not None:
            name, c = "llamacpp:requests_processing", crossover[0]
            cases = [
                (f"{c} requests busy all along", {name: f"{c}x{n}"}, float(c), True),
                (f"{c - 1} requests busy all along", {name: f"{c - 1}x{n}"}, None, False),
            ]
        for what, series, value, fires in cases:
            got = {"alertname": alert, **labels, **rule.get("labels", {})}
            expected = []
            if fires:
                exp_labels = {k: v for k, v in got.items() if k != "alertname"}
                annotations = {
                    k: _expand(v, got, value) for k, v in rule.get("annotations", {}).items()
                }
                expected = [{"exp_labels": exp_labels, "exp_annotations": annotations}]
            tests.append(
                {
                    "name": f"{alert} {'fires' if fires else 'stays quiet'}: {what}",
                    "interval": step,
                    "input_series": [
                        {"series": f"{name}{sel}", "values": values}
                        for name, values in series.items()
                    ],
                    "alert_rule_test": [
                        {"eval_time": when, "alertname": alert, "exp_alerts": expected}
                    ],
                }
            )
    return {"rule_files": [RULES], "evaluation_interval": step, "tests": tests}


# --- writing, and the compose file -----------------------------------------------------------


def write(rendering: Rendering, out: Path) -> list[Path]:
    """Every file of `rendering` into `out`, each one atomically (perf.monitoring_write)."""
    return write_files(rendering.files, out)


def read_record(folder: Path, recipe: str) -> dict:
    """The record (RECORD) of the files `recipe monitor` rendered into `folder` for `recipe`;
    one paragraph when there is none, or it is another recipe's."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        raise LlamaspecError(
            f"--with-prometheus {folder} holds no rendered monitoring files ({RECORD}): "
            f"render them first with `llamaspec recipe monitor {recipe} --out {folder}`."
        ) from None
    if not isinstance(record, dict) or record.get("recipe") != recipe:
        other = record.get("recipe") if isinstance(record, dict) else None
        raise LlamaspecError(
            f"--with-prometheus {folder} was rendered for recipe {other!r}, not {recipe!r}: "
            f"its rules judge another recipe's baseline. Render this one with `llamaspec "
            f"recipe monitor {recipe} --out DIR`."
        )
    return record


def compose_prometheus(compose: str, recipe: str, folder: Path) -> str:
    """A compose file (images/registry.py's) with a Prometheus service beside llama-server:
    it mounts `folder` (rendered by `recipe monitor RECIPE --out DIR`) read-only, scrapes
    the server by its service name and evaluates the rendered rules; the server gets
    /metrics (LLAMA_ARG_ENDPOINT_METRICS=1). Its UI is published on 127.0.0.1:9090."""
    check_folder(folder, "--with-prometheus")
    read_record(folder, recipe)
    head = "".join(line + "\n" for line in compose.splitlines() if line.startswith("#"))
    data = yaml.safe_load(compose)
    server = data["services"]["llama-server"]
    env = server.setdefault("environment", {})
    env["LLAMA_ARG_ENDPOINT_METRICS"] = "1"
    data["services"]["prometheus"] = {
        "image": PROMETHEUS_IMAGE,
        "command": [
            f"--config.file={CONTAINER_DIR}/{SCRAPE_COMPOSE}",
            "--storage.tsdb.path=/prometheus",
        ],
        "ports": ["127.0.0.1:9090:9090"],
        "volumes": [
            {
                "type": "bind",
                "source": str(folder.resolve()),
                "target": CONTAINER_DIR,
                "read_only": True,
            }
        ],
        "depends_on": ["llama-server"],
    }
    head += (
        f"# Prometheus ({PROMETHEUS_IMAGE}) scrapes llama-server and evaluates the rules "
        f"rendered in {folder.name}/ (its UI: http://127.0.0.1:9090/alerts).\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False)
