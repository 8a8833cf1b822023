"""The rendered alert rules on a real Prometheus scraping real llama-servers (issue 45).

Two servers of recipe gemma3-270m-self (the embedded model drafting for itself) run on
loopback with /metrics: one as the recipe renders it, one with its spec type taken out, run
by the stock build of the pin, so it loads the draft and drafts nothing (upstream #25345;
the default build carries the fix, spec-type-from-plain-draft). Debian's `prometheus` scrapes both
every second with the rules `recipe monitor` rendered (short windows and `for:` given as
the render's own parameters) and the test asks its HTTP API what it saw and what fired:
DraftIdle on the idle server only, requests deferred there (three requests, one slot),
acceptance quiet while greedy and low once the target samples at a high temperature, and
the server down once it is killed. `promtool check rules` and `test rules` run on the
rendered files, and a rules file edited into invalid YAML makes `promtool` fail.
Prometheus and promtool missing is a failure, never a skip: CI installs them (.ci/run).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from llamaspec.engine.artifact import Artifact
from llamaspec.images.commands import server_args
from llamaspec.perf import monitoring
from llamaspec.runtime import client, metrics

from helpers import llamaspec

pytestmark = pytest.mark.integration
RECIPE = "gemma3-270m-self"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: the Prometheus test needs Debian's `prometheus` package "
            "(it brings promtool): apt-get install prometheus (.ci/run installs it)."
        )
    return path


def _wait(what: str, check: Callable[[], object], timeout: float = 40) -> object:
    """Poll `check` until it returns something true; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"after {timeout:g}s: {what}")


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        reply = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10).json()
        assert reply["status"] == "success", (expr, reply)
        return reply["data"]["result"]

    def alerts(self, name: str, instance: str, state: str | None = None) -> list[dict]:
        reply = httpx.get(self.url + "/api/v1/alerts", timeout=10).json()
        return [
            a
            for a in reply["data"]["alerts"]
            if a["labels"]["alertname"] == name
            and a["labels"].get("instance") == instance
            and (state is None or a["state"] == state)
        ]

    def ever(self, name: str, instance: str, state: str | None = None) -> list[dict]:
        """The alert's pending or firing (or only `state`) series of the last 5 minutes
        (ALERTS): what the rule said at any evaluation, not only now."""
        only = f', alertstate="{state}"' if state else ""
        return self.query(f'ALERTS{{alertname="{name}", instance="{instance}"{only}}}[5m]')

    def rule_state(self, name: str) -> str:
        reply = httpx.get(self.url + "/api/v1/rules", timeout=10).json()
        rules = [r for g in reply["data"]["groups"] for r in g["rules"] if r["name"] == name]
        assert len(rules) == 1, reply
        return rules[0]["state"]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[Path], Prom]]:
    procs: list[subprocess.Popen] = []

    def start(config: Path) -> Prom:
        port = client.free_port()
        log = (tmp_path / "prometheus.log").open("w")
        procs.append(
            subprocess.Popen(
                [
                    _tool("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert procs[-1].poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return httpx.get(url + "/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("Prometheus did not become ready", ready, 30)
        return Prom(url)

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _complete(server: client.Server, n: int, **sampling: float) -> dict:
    payload = {"prompt": "List the days of the week:", "n_predict": n, "cache_prompt": False}
    return server.post("/completion", payload | (sampling or {"temperature": 0.0, "top_k": 1}))


def test_prometheus_scrapes_a_speculating_server_and_the_rendered_alerts_fire_as_they_should(
    upstream_artifact: Artifact,
    upstream_stock_artifact: Artifact,
    tmp_path: Path,
    prometheus: Callable[[Path], Prom],
) -> None:
    promtool = _tool("promtool")
    _tool("prometheus")
    shown = llamaspec(
        "recipe", "show", RECIPE, "--artifact", upstream_artifact.id,
        "--dist", str(upstream_artifact.path.parent), "--format", "argv",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    args = [*server_args(json.loads(shown.stdout)), "-t", "1", "--metrics", "--no-warmup"]
    i = args.index("--spec-type")
    idle_args = args[:i] + args[i + 2 :]  # the draft loaded, no spec type: it never drafts
    binary = upstream_artifact.server

    with (
        client.running(binary, args, tmp_path / "good.log") as good,
        client.running(upstream_stock_artifact.server, idle_args, tmp_path / "idle.log") as idle,
    ):
        g, d = f"127.0.0.1:{good.port}", f"127.0.0.1:{idle.port}"
        out = tmp_path / "monitoring"
        proc = llamaspec(
            "recipe", "monitor", RECIPE, "--out", str(out), "--window", "10s", "--for", "1s",
            "--scrape-interval", "1s", "--target", g,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record = json.loads((out / monitoring.RECORD).read_text())
        # every alert but the crossover's: speed by client count was not measured for it
        assert record["alerts"] == [a for a in monitoring.ALERTS if a != monitoring.BUSY]
        assert [o["alert"] for o in record["omitted"]] == [monitoring.BUSY]
        assert record["baseline"]["measured"] is True  # the committed bench report's
        threshold = record["threshold"]

        for argv in ([promtool, "check", "rules", monitoring.RULES],
                     [promtool, "test", "rules", monitoring.RULES_TEST],
                     [promtool, "check", "config", monitoring.SCRAPE]):  # fmt: skip
            run = subprocess.run(argv, cwd=out, capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stdout + run.stderr
            assert "SUCCESS" in run.stdout + run.stderr

        config = yaml.safe_load((out / monitoring.SCRAPE).read_text())
        config["scrape_configs"][0]["static_configs"][0]["targets"].append(d)
        config["rule_files"] = [str(out / monitoring.RULES)]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = prometheus(tmp_path / "prometheus.yml")
        job = record["job"]
        _wait("both servers scraped up", lambda: len(prom.query(f'up{{job="{job}"}} == 1')) == 2)

        # greedy requests on the good server; three at once on the idle one's single slot
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            busy = [pool.submit(_complete, idle, 32) for _ in range(3)]
            first = [_complete(good, 32) for _ in range(2)]
            for f in busy:
                f.result()
        assert all(r["tokens_predicted"] > 0 for r in first)

        drafted = "llamacpp:spec_decode_num_draft_tokens_total"
        _wait(
            "the good server's draft counter was not scraped above 0",
            lambda: prom.query(f'{drafted}{{instance="{g}"}} > 0'),
        )
        assert prom.query(f'{drafted}{{instance="{d}"}} == 0'), "the idle server drafted"
        assert prom.query(
            f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{instance="{g}"}}'
        )
        rate = (
            f'sum(increase(llamacpp:spec_decode_num_accepted_tokens_total{{instance="{g}"}}[5m]))'
            f' / sum(increase({drafted}{{instance="{g}"}}[5m]))'
        )
        greedy = prom.query(rate)
        assert greedy and float(greedy[0]["value"][1]) > threshold, (greedy, threshold)
        firing = _wait(
            "LlamaSpecDraftIdle did not fire for the server that loads a draft and drafts none",
            lambda: prom.ever(monitoring.IDLE, d, "firing"),
        )
        assert firing[0]["metric"]["recipe"] == RECIPE
        deferred = _wait(
            "LlamaSpecRequestsDeferred was never pending or firing while three requests "
            "shared one slot",
            lambda: prom.ever(monitoring.DEFERRED, d),
        )
        assert not prom.ever(monitoring.IDLE, g), "DraftIdle on the server that drafts"
        assert not prom.ever(monitoring.LOW, g), "AcceptanceLow while drafts are accepted"

        # every dashboard query is valid PromQL on this Prometheus and the panels have data
        board = json.loads((out / monitoring.DASHBOARD).read_text())
        empty = []
        for panel in board["panels"]:
            for target in panel.get("targets", ()):
                expr = target["expr"].replace("$instance", ".*")
                expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m")
                if not prom.query(expr):
                    empty.append(panel["title"])
        assert not empty, f"dashboard panels without data: {empty}"

        # the target now samples at a high temperature: few of the greedy drafts survive
        accepted = "llamacpp:spec_decode_num_accepted_tokens_total"

        def scraped(name: str) -> float:
            return float(prom.query(f'{name}{{instance="{g}"}}')[0]["value"][1])

        def live() -> metrics.SpecCounters:
            counters = metrics.read(good.url)
            assert counters is not None and counters.available, "the good server's /metrics"
            return counters

        # the hot request's own counters, read from the server (a scrape may still lag the
        # greedy requests: CI once read 1.0 here, the second greedy request's acceptance)
        before = live()
        _complete(good, 16, temperature=4.0, top_k=0, top_p=1.0, min_p=0.0)
        after = live()
        hot_counts = after - before
        assert hot_counts.drafted > 0, "the hot request drafted nothing"
        hot = hot_counts.accepted / hot_counts.drafted
        assert hot < threshold, (hot, threshold)
        _wait(
            "the hot request's drafts were not scraped",
            lambda: scraped(drafted) >= after.drafted and scraped(accepted) >= after.accepted,
        )
        _wait(
            "LlamaSpecAcceptanceLow did not fire while the target sampled at temperature 4",
            lambda: prom.ever(monitoring.LOW, g, "firing"),
        )

        good.proc.terminate()  # the good server dies
        good.proc.wait(timeout=30)
        down = _wait(
            "LlamaServerDown did not fire for the killed server",
            lambda: prom.alerts(monitoring.DOWN, g, "firing"),
        )
        assert not prom.alerts(monitoring.DOWN, d), "the live server counted as down"
        print(
            f"caught: {monitoring.IDLE} on {d}; {monitoring.DEFERRED} ({len(deferred)} "
            f"series); {monitoring.LOW} (acceptance {hot:.2f} at temperature 4, threshold "
            f"{threshold}); "
            f"{monitoring.DOWN} {down[0]['state']}"
        )
        assert prom.rule_state(monitoring.DOWN) == "firing"

    # bad input: the rules file edited into invalid YAML
    broken = tmp_path / "broken" / monitoring.RULES
    broken.parent.mkdir()
    broken.write_text((out / monitoring.RULES).read_text().replace("  rules:", "  rules: [", 1))
    run = subprocess.run(
        [promtool, "check", "rules", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0, run.stdout + run.stderr
    assert "yaml" in (run.stdout + run.stderr).lower(), run.stdout + run.stderr
