"""`llamaspec recipe monitor` (perf/monitoring.py, perf/monitoring_baseline.py): the alert
rules, their promtool tests, the scrape configs and the Grafana dashboard rendered per
recipe, the baseline from a bench report, the alerts a recipe gets, --out, the compose
service and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from llamaspec.cli.main import main
from llamaspec.errors import LlamaspecError
from llamaspec.images import commands
from llamaspec.perf import monitoring as mon
from llamaspec.perf import monitoring_baseline as base

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "monitoring"
EXAMPLE_REPORT = "reports/bench-gemma3-270m-q4-draft-llamacpp-cpu-9036434bcbf5-1client.json"


def _rules(r: mon.Rendering) -> list[dict]:
    return yaml.safe_load(r.files[mon.RULES])["groups"][0]["rules"]


def _report(path: Path, recipe: str, date: str, drafted: int, accepted: int, **extra) -> Path:
    cell = {
        "workload": "copy",
        "concurrency": 1,
        "summary": {"drafted": drafted, "accepted": accepted, "speedup": 1.5},
    }
    data = {
        "recipe": recipe,
        "artifact_id": "llamacpp-cpu-0123456789ab",
        "engine": "llama.cpp",
        "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "backend": "cpu",
        "date": date,
        "repetitions": 3,
        "concurrency": [1],
        "workloads": [cell],
        "reliability": {"reliable": True, "reasons": []},
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


MEASURED = base.Baseline(0.8, True, "a report", 1.4, "geometric mean", "reports/x.json")


CROSSOVER = (4, "measured at 1, 2, 4, 8 clients in reports/bench-x.json")


def test_a_draft_recipe_gets_all_five_alerts_each_with_a_firing_and_a_quiet_test() -> None:
    r = mon.render("gemma3-270m-self", ("draft",), "llama.cpp", mon.Settings(), MEASURED,
                   CROSSOVER)  # fmt: skip
    assert r.alerts == mon.ALERTS and r.omitted == ()
    rules = _rules(r)
    assert [x["alert"] for x in rules] == list(mon.ALERTS)
    for rule in rules:
        assert 'job="llamaspec-gemma3-270m-self"' in rule["expr"], rule["alert"]
        assert rule["labels"]["recipe"] == "gemma3-270m-self"
        assert rule["for"] == mon.DEFAULT_FOR[rule["alert"]]
        assert "@" not in json.dumps(rule)  # every placeholder filled
    low = next(x for x in rules if x["alert"] == mon.LOW)
    assert "< 0.4" in low["expr"] and r.threshold == 0.4  # 0.5 of the baseline 0.8
    assert ">= 50" in low["expr"]
    tests = yaml.safe_load(r.files[mon.RULES_TEST])["tests"]
    for alert in mon.ALERTS:
        cases = [t for t in tests if t["alert_rule_test"][0]["alertname"] == alert]
        assert any(t["alert_rule_test"][0]["exp_alerts"] for t in cases), alert
        assert any(not t["alert_rule_test"][0]["exp_alerts"] for t in cases), alert
    # the rendered files say where the baseline came from
    for name in (mon.RULES, mon.RULES_TEST, mon.SCRAPE):
        assert r.files[name].startswith("# Rendered by `llamaspec recipe monitor")
        assert "acceptance 0.800 (measured: a report)" in r.files[name]
    assert "NOT MEASURED" not in r.files[mon.RULES]
    record = json.loads(r.files[mon.RECORD])
    assert record["baseline"]["measured"] is True and record["baseline"]["speedup"] == 1.4
    busy = next(x for x in rules if x["alert"] == mon.BUSY)
    assert busy["expr"].endswith(">= 4") and "requests_processing" in busy["expr"]
    assert "reports/bench-x.json" in busy["annotations"]["description"]
    assert record["crossover"] == {"clients": 4, "source": CROSSOVER[1]}


def test_without_a_measured_crossover_the_crossover_alert_is_left_out_and_says_why() -> None:
    r = mon.render("gemma3-270m-self", ("draft",), "llama.cpp", mon.Settings(), MEASURED)
    assert mon.BUSY not in r.alerts
    assert dict(r.omitted)[mon.BUSY].startswith("no crossover measured for this recipe")
    assert json.loads(r.files[mon.RECORD])["crossover"] is None


def test_an_ngram_recipe_gets_no_draft_idle_alert_and_the_rendering_says_why() -> None:
    r = mon.render("gemma3-270m-ngram", ("ngram-mod",), "llama.cpp", mon.Settings(), MEASURED)
    assert mon.IDLE not in r.alerts and mon.LOW in r.alerts
    assert dict(r.omitted)[mon.IDLE].startswith("spec types ngram-mod draft from repeats")
    assert f"Left out: {mon.IDLE}: spec types ngram-mod" in r.files[mon.RULES]


@pytest.mark.parametrize(
    ("types", "engine", "why"),
    [
        ((), "llama.cpp", "the recipe has no speculation"),
        (("mtp",), "ik_llama.cpp", "ik_llama.cpp's llama-server exports no speculation"),
    ],
)
def test_without_speculation_counters_no_spec_alert_or_panel_is_rendered(
    types: tuple[str, ...], engine: str, why: str
) -> None:
    r = mon.render("qwen3.5-27b-mtp", types, engine, mon.Settings(), MEASURED)
    assert r.alerts == (mon.DOWN, mon.DEFERRED) and r.baseline is None and r.threshold is None
    assert {a for a, _ in r.omitted} == {mon.IDLE, mon.LOW, mon.BUSY}
    assert all(w.startswith(why) for a, w in r.omitted if a != mon.BUSY)
    assert "No speculation alerts, so no acceptance baseline." in r.files[mon.RULES]
    board = json.loads(r.files[mon.DASHBOARD])
    assert "spec_decode" not in json.dumps(board)
    assert {p["title"] for p in board["panels"]} >= {"server up", "busy and deferred requests"}
    assert json.loads(r.files[mon.RECORD])["baseline"] is None


def test_the_dashboard_has_the_panels_and_no_placeholders() -> None:
    r = mon.render("gemma3-270m-self", ("draft",), "llama.cpp", mon.Settings(), MEASURED)
    board = json.loads(r.files[mon.DASHBOARD])
    titles = [p["title"] for p in board["panels"]]
    assert titles[:3] == ["server up", "baseline and alerts", "draft acceptance rate"]
    assert "drafted vs accepted tokens/s" in titles and "generated tokens/s" in titles
    assert any(t.startswith("acceptance by draft position") for t in titles)
    text = json.dumps(board)
    assert "@" not in text.replace("@UID@", "") and "llamaspec_needs" not in text
    assert "vector(0.800)" in text and "vector(0.4)" in text
    assert board["uid"] == "llamaspec-gemma3-270m-self"


def test_quotes_in_the_baseline_source_break_neither_the_rules_nor_the_dashboard() -> None:
    odd = base.Baseline(0.6, True, 'reports/bench-"odd"\\name.json', None, "")
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(), odd)
    low = _rules(r)[-1]["annotations"]["description"]
    assert 'reports/bench-"odd"\\name.json' in low
    assert 'bench-"odd"' in json.loads(r.files[mon.DASHBOARD])["description"]


def test_the_scrape_configs_point_at_the_target_and_the_compose_service() -> None:
    s = mon.Settings(target="10.0.0.5:9000", scrape_interval="5s")
    r = mon.render("gemma3-270m-self", ("draft",), "llama.cpp", s, MEASURED)
    host, compose = (yaml.safe_load(r.files[n]) for n in (mon.SCRAPE, mon.SCRAPE_COMPOSE))
    assert host["scrape_configs"][0]["static_configs"][0]["targets"] == ["10.0.0.5:9000"]
    assert compose["scrape_configs"][0]["static_configs"][0]["targets"] == ["llama-server:8080"]
    assert host["rule_files"] == [mon.RULES] and host["global"]["scrape_interval"] == "5s"
    assert host["scrape_configs"][0]["job_name"] == "llamaspec-gemma3-270m-self"


def test_one_for_duration_overrides_every_alerts_default() -> None:
    s = mon.Settings(window="20s", hold="2s", scrape_interval="1s")
    r = mon.render("gemma3-270m-self", ("draft",), "llama.cpp", s, MEASURED)
    assert {x["for"] for x in _rules(r)} == {"2s"}
    assert all("[20s]" in x["expr"] for x in _rules(r) if x["alert"] in (mon.IDLE, mon.LOW))


def test_the_baseline_is_the_newest_report_of_that_recipe_and_engine(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    _report(reports / "bench-r-a.json", "r", "2026-01-01", 100, 90)
    newest = _report(reports / "bench-r-b.json", "r", "2026-02-01", 200, 100)
    _report(reports / "bench-r-c.json", "r", "2026-03-01", 100, 10, engine="ik_llama.cpp")
    _report(reports / "bench-r-longer-d.json", "r-longer", "2026-04-01", 100, 5)
    _report(reports / "bench-r-e.json", "r", "2026-05-01", 0, 0)  # drafted nothing
    (reports / "bench-r-f.json").write_text("{not json")
    b = base.find_baseline("r", "llama.cpp", [reports], tmp_path)
    assert b.measured and b.acceptance == 0.5 and b.report == "reports/bench-r-b.json"
    assert "100 of 200 draft tokens accepted in reports/bench-r-b.json, 2026-02-01" in b.source
    assert "llama.cpp, 0c1e570, cpu" in b.source and b.speedup == 1.5
    # on the same date, a reliable report before an unreliable one
    _report(reports / "bench-r-g.json", "r", "2026-02-01", 100, 20,
            reliability={"reliable": False, "reasons": ["load"]})  # fmt: skip
    assert base.find_baseline("r", "llama.cpp", [reports], tmp_path).acceptance == 0.5
    # an explicit report, and an explicit value
    b = base.find_baseline("r", "llama.cpp", [reports], tmp_path, newest.parent / "bench-r-a.json")
    assert b.acceptance == 0.9
    b = base.find_baseline("r", "llama.cpp", [reports], tmp_path, acceptance=0.6)
    assert (b.acceptance, b.measured, b.source) == (0.6, False, "given with --baseline-acceptance")


def test_an_unreliable_report_gives_its_acceptance_but_no_speedup(tmp_path: Path) -> None:
    path = _report(tmp_path / "bench-r-a.json", "r", "2026-01-01", 100, 70,
                   reliability={"reliable": False, "reasons": ["spread"]})  # fmt: skip
    b = base.find_baseline("r", "llama.cpp", [tmp_path], tmp_path, path)
    assert b.acceptance == 0.7 and b.speedup is None
    assert b.speedup_note.startswith("no speedup quoted: unreliable: spread")


def test_without_a_report_the_baseline_is_assumed_and_the_files_say_not_measured(
    tmp_path: Path,
) -> None:
    b = base.find_baseline("r", "llama.cpp", [tmp_path / "none"], tmp_path)
    assert (b.acceptance, b.measured) == (base.ASSUMED_ACCEPTANCE, False)
    assert "run `llamaspec bench r` or give --baseline-acceptance" in b.source
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(), b)
    assert "The baseline is NOT MEASURED" in r.files[mon.RULES]
    assert "not measured: assumed" in _rules(r)[-1]["annotations"]["description"]
    assert "baseline (not measured)" in r.files[mon.DASHBOARD]


def test_the_baseline_is_the_newest_measured_report_of_any_kind(tmp_path: Path) -> None:
    """Bench, load and the tune report that wrote a tuned recipe all measure acceptance; the
    newest one is the baseline, and the baseline says which kind it is."""
    reports = tmp_path / "reports"
    _report(reports / "bench-r-a.json", "r", "2026-01-01", 100, 90)
    phases = [
        {"mode": "spec", "acceptance": {"drafted": 300, "accepted": 240}},
        {"mode": "plain", "acceptance": {"drafted": 0, "accepted": 0}},
        {"mode": "spec", "acceptance": {"drafted": 100, "accepted": 60}},
    ]
    load = {"recipe": "r", "engine": "llama.cpp", "date": "2026-02-01", "phases": phases}
    (reports / "load-r-x-soak.json").write_text(json.dumps(load))
    b = base.find_baseline("r", "llama.cpp", [reports], tmp_path)
    assert (b.acceptance, b.report_kind, b.speedup) == (0.75, "load", None)
    assert "300 of 400 draft tokens accepted in the speculative phases of a load run" in b.source
    assert b.kind == "measured, load report" and "load report" in b.describe()
    tune = {"recipe": "base", "engine": "llama.cpp", "date": "2026-03-01",
            "winner": {"accepted_drafted": {"copy": [45, 50], "qa": [5, 50]}}}  # fmt: skip
    (reports / "tune-base-x.json").write_text(json.dumps(tune))
    (reports / "tune-base-x.md").write_text("# tune\n")
    b = base.find_baseline(
        "r", "llama.cpp", [reports], tmp_path, tuned_by=reports / "tune-base-x.md"
    )
    assert (b.acceptance, b.report_kind) == (0.5, "tune")
    assert b.report == "reports/tune-base-x.json"
    # without the tuned recipe's pointer a tune report of another recipe is not this one's
    assert base.find_baseline("r", "llama.cpp", [reports], tmp_path).report_kind == "load"
    # a load run on another engine, or without speculative drafts, is no baseline
    (reports / "load-r-y.json").write_text(json.dumps({**load, "date": "2026-04-01",
                                                       "engine": "ik_llama.cpp"}))  # fmt: skip
    (reports / "load-r-z.json").write_text(json.dumps({**load, "date": "2026-04-01",
                                                       "phases": phases[1:2]}))  # fmt: skip
    assert base.find_baseline("r", "llama.cpp", [reports], tmp_path).report_kind == "load"
    assert base.find_baseline("r", "llama.cpp", [reports], tmp_path).acceptance == 0.75


def test_the_tuned_recipe_baseline_is_measured_not_assumed() -> None:
    r = mon.for_recipe("gemma3-270m-ngram-tuned", mon.Settings(), root=ROOT)
    assert r.baseline is not None and r.baseline.measured
    assert r.baseline.report_kind in ("bench", "tune", "load")


def test_the_catalog_recipe_baseline_comes_from_its_committed_report() -> None:
    r = mon.for_recipe("gemma3-270m-ngram", mon.Settings(), root=ROOT)
    assert r.baseline is not None and r.baseline.measured
    assert r.baseline.report.startswith("reports/bench-gemma3-270m-ngram-")
    assert mon.IDLE not in r.alerts
    r = mon.for_recipe("gemma3-270m-self", mon.Settings(), engine="ik_llama.cpp", root=ROOT)
    assert r.alerts == (mon.DOWN, mon.DEFERRED)


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"window": "10 minutes"}, "--window '10 minutes' is not a Prometheus duration"),
        ({"window": "1s", "scrape_interval": "15s"}, "shorter than two scrapes"),
        ({"scrape_interval": "0s"}, "longer than zero"),
        ({"hold": "soon"}, "--for 'soon' is not a Prometheus duration"),
        ({"fraction": 0.0}, "--fraction 0.0 is not between 0 and 1"),
        ({"fraction": 1.5}, "--fraction 1.5 is not between 0 and 1"),
        ({"target": "nohost"}, "--target 'nohost' is not HOST:PORT"),
        ({"target": "h:99999"}, "--target 'h:99999' is not HOST:PORT"),
        ({"window": "10m\n"}, "--window '10m\\n' is not a Prometheus duration"),
        ({"window": " 10m"}, "--window ' 10m' is not a Prometheus duration"),
        ({"scrape_interval": "15s\t"}, "--scrape-interval '15s\\t' is not a Prometheus"),
        ({"hold": "5m "}, "--for '5m ' is not a Prometheus duration"),
        ({"target": 'a"} or vector(1) #:8080'}, "is not HOST:PORT"),
        ({"target": "a\nb:8080"}, "--target 'a\\nb:8080' is not HOST:PORT"),
        ({"target": "a}:8080"}, "--target 'a}:8080' is not HOST:PORT"),
        ({"target": "h:0"}, "--target 'h:0' is not HOST:PORT"),
        ({"target": "::1:8080"}, "--target '::1:8080' is not HOST:PORT"),
    ],
)
def test_bad_settings_are_one_paragraph(kwargs: dict, expect: str) -> None:
    with pytest.raises(LlamaspecError, match=None) as err:
        mon.render("r", ("draft",), "llama.cpp", mon.Settings(**kwargs), MEASURED)
    assert expect in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, float("nan")])
def test_a_bad_baseline_acceptance_is_refused(value: float) -> None:
    with pytest.raises(LlamaspecError, match="--baseline-acceptance .* is not a share"):
        base.given_baseline(value)


def test_a_report_of_another_recipe_or_not_a_report_is_refused(tmp_path: Path) -> None:
    other = _report(tmp_path / "bench-x.json", "x", "2026-01-01", 10, 5)
    with pytest.raises(LlamaspecError, match="measured recipe 'x', not 'r'"):
        base.find_baseline("r", "llama.cpp", [], tmp_path, other)
    (tmp_path / "junk.json").write_text("[]")
    with pytest.raises(LlamaspecError, match="is not a bench report"):
        base.find_baseline("r", "llama.cpp", [], tmp_path, tmp_path / "junk.json")
    idle = _report(tmp_path / "bench-r.json", "r", "2026-01-01", 0, 0)
    with pytest.raises(LlamaspecError, match="drafted no token at all"):
        base.find_baseline("r", "llama.cpp", [], tmp_path, idle)


def test_write_puts_every_file_in_out_atomically_and_nothing_else(tmp_path: Path) -> None:
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(), MEASURED)
    out = tmp_path / "new" / "dir"
    written = mon.write(r, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(mon.FILES)
    assert [p.name for p in written] == list(r.files)
    assert all((out / n).read_text() == t for n, t in r.files.items())
    (out / mon.RULES).write_text("old")
    mon.write(r, out)  # again: replaced, no temporary file left
    assert (out / mon.RULES).read_text() == r.files[mon.RULES]
    assert sorted(p.name for p in out.iterdir()) == sorted(mon.FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_out_that_is_a_file_under_a_file_or_not_writable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(), MEASURED)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(LlamaspecError, match="is a file, not a directory"):
        mon.write(r, afile)
    with pytest.raises(LlamaspecError, match="lies under .*afile, which is a file"):
        mon.write(r, afile / "sub")
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(LlamaspecError, match="is not writable by this user"):
        mon.write(r, tmp_path / "locked")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_cli_renders_into_out_and_refuses_bad_input_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "mon"
    argv = ["recipe", "monitor", "gemma3-270m-self", "--out", str(out), "--for", "2s"]
    assert main([*argv, "--baseline-acceptance", "0.9"]) == 0
    text = capsys.readouterr().out
    assert "alerts: LlamaServerDown" in text and "the baseline is NOT MEASURED" in text
    record = json.loads((out / mon.RECORD).read_text())
    assert record["baseline"]["acceptance"] == 0.9 and record["settings"]["hold"] == "2s"
    for bad, expect in (
        (["recipe", "monitor", "nope", "--out", str(tmp_path / "x")], "Unknown recipe 'nope'"),
        ([*argv[:4], str(tmp_path / "y"), "--baseline-acceptance", "2"], "--baseline-acceptance"),
        ([*argv[:4], str(tmp_path / "z"), "--engine", "nope"], "Unknown engine 'nope'"),
    ):
        assert main(bad) == 2
        assert expect in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mon"]


def test_compose_with_prometheus_adds_the_service_with_the_rendered_folder(tmp_path: Path) -> None:
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(), MEASURED)
    mon.write(r, tmp_path / "mon")
    base = commands.compose("r", "img:1", "cpu", ["llama-server", "-m", "/models/t.gguf"], [])
    text = mon.compose_prometheus(base, "r", tmp_path / "mon")
    assert text.startswith("# llamaspec recipe r: `docker compose up`.")
    data = yaml.safe_load(text)
    server, prom = data["services"]["llama-server"], data["services"]["prometheus"]
    assert server["environment"]["LLAMA_ARG_ENDPOINT_METRICS"] == "1"
    assert server["command"] == ["-m", "/models/t.gguf"]
    assert prom["image"] == mon.PROMETHEUS_IMAGE and prom["ports"] == ["127.0.0.1:9090:9090"]
    assert prom["volumes"][0]["source"] == str((tmp_path / "mon").resolve())
    assert prom["volumes"][0]["read_only"] is True
    assert f"--config.file={mon.CONTAINER_DIR}/{mon.SCRAPE_COMPOSE}" in prom["command"]
    with pytest.raises(LlamaspecError, match="rendered for recipe 'r', not 'other'"):
        mon.compose_prometheus(base, "other", tmp_path / "mon")
    with pytest.raises(LlamaspecError, match="holds no rendered monitoring files"):
        mon.compose_prometheus(base, "r", tmp_path)


@pytest.mark.parametrize("target", ["[::1]:8080", "llama-server:8080", "10.0.0.5:1"])
def test_a_strict_target_renders_as_written(target: str) -> None:
    r = mon.render("r", ("draft",), "llama.cpp", mon.Settings(target=target), MEASURED)
    scrape = yaml.safe_load(r.files[mon.SCRAPE])
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [target]


def test_a_folder_with_a_newline_is_refused_before_the_compose_file(tmp_path: Path) -> None:
    """A newline in its name would start a top-level key of the compose file."""
    folder = tmp_path / "mon\ninclude: [evil.yml]\n#"
    mon.write(mon.render("r", ("draft",), "llama.cpp", mon.Settings(), MEASURED), folder)
    base = commands.compose("r", "img:1", "cpu", ["llama-server", "-m", "/models/t.gguf"], [])
    with pytest.raises(LlamaspecError, match="holds a control character") as err:
        mon.compose_prometheus(base, "r", folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--window", "10m\n"], "argument 7 ('10m\\n') holds a control character"),
        (["--for", " 5m"], "argument --for: ' 5m' is not a Prometheus duration"),
        (["--scrape-interval", "15s "], "argument --scrape-interval: '15s '"),
        (["--target", 'a"} or vector(1) #:8080'], "argument --target: --target 'a\"}"),
        (["--target", "a\nb:8080"], "argument 7 ('a\\nb:8080') holds a control character"),
    ],
)
def test_monitor_refuses_what_would_reach_its_files_at_parse_time(
    argv: list[str], expect: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "mon"
    with pytest.raises(SystemExit) as exit_:
        main(["recipe", "monitor", "gemma3-270m-ngram", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and expect in err and "Traceback" not in err
    assert not out.exists()


def test_with_prometheus_refuses_a_control_character_at_parse_time(
    capsys: pytest.CaptureFixture,
) -> None:
    argv = ["recipe", "show", "gemma3-270m-ngram", "--format", "compose"]
    with pytest.raises(SystemExit):
        main([*argv, "--with-prometheus", "mon\ninclude: x"])
    assert "('mon\\ninclude: x') holds a control character" in capsys.readouterr().err


def test_with_prometheus_goes_with_compose_only(capsys: pytest.CaptureFixture) -> None:
    argv = ["recipe", "show", "gemma3-270m-ngram", "--with-prometheus", "x"]
    assert main(argv) == 2
    assert "--with-prometheus goes with --format compose only" in capsys.readouterr().err


def test_the_committed_example_is_what_the_renderer_makes_now() -> None:
    """docs/examples/monitoring/ is `recipe monitor gemma3-270m-q4-draft --report
    EXAMPLE_REPORT` as committed; rewrite it after a template change with
    `python tests/unit/test_monitoring.py`."""
    assert sorted(p.name for p in EXAMPLE.iterdir()) == sorted(mon.FILES)
    for name, text in _example().files.items():
        assert (EXAMPLE / name).read_text() == text, f"{name}: rerun this file to rewrite it"


def _example() -> mon.Rendering:
    return mon.for_recipe("gemma3-270m-q4-draft", mon.Settings(), report=ROOT / EXAMPLE_REPORT,
                          root=ROOT)  # fmt: skip


if __name__ == "__main__":
    mon.write(_example(), EXAMPLE)
    print(f"wrote {EXAMPLE.relative_to(ROOT)}")
