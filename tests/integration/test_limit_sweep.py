"""`llamaspec limit` on the real server (issue 52): a short sweep of synthetic acceptance on
the embedded model times the verification step at both ends, each in two server processes,
prices every point's own rounds between them and writes the report with its noise stated.
Speed is not asserted (a 2-core machine shared with other tests): what is checked is that
each number the ceiling rests on was measured and that the report says how it was made."""

from __future__ import annotations

import json

import pytest

from helpers import llamaspec

pytestmark = pytest.mark.integration


def test_a_short_sweep_times_both_ends_in_two_processes_and_prices_each_point(
    upstream_artifact, gemma_path, tmp_path
) -> None:
    proc = llamaspec(
        "limit", "--artifact", upstream_artifact.id, "--dist", str(upstream_artifact.path.parent),
        "--alphas", "0,0.9", "--lengths", "2", "--repetitions", "1", "--tokens", "16",
        "--reports", str(tmp_path),
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    rep = json.loads((tmp_path / f"limit-{upstream_artifact.id}.json").read_text())
    [step] = rep["steps"]
    assert step["length"] == 2
    ends = [step["accepted"], step["rejected"]]
    for end in ("accepted", "rejected"):
        timed = step[end]
        assert len(timed["processes"]) == 2, timed  # two server processes, each its median
        assert len(timed["ratios"]) == 2 * rep["plan"]["step_repetitions"]
        assert all(r > 0.5 for r in timed["ratios"]), timed  # a step costs about a decode+
    assert rep["noise"]["step_processes"] is not None
    points = {p["alpha"]: p for p in rep["points"]}
    assert set(points) == {0.0, 0.9}
    assert points[0.0]["alpha_per_token"] == 0.0  # every draft rejected
    assert points[0.9]["alpha_per_token"] > 0.5  # most accepted (by coin flip: maybe all)
    # beyond noise: past the cheapest step by more than the step's server, started again,
    # ran from itself (each point runs in a server process of its own)
    margin = max((max(t["processes"]) - min(t["processes"])) / t["ratio"] for t in ends)
    for p in points.values():
        assert p["ceiling"] and p["ceiling_high"] >= p["ceiling"] * 0.99, p
        assert p["above"] == (p["speedup_low"] > p["ceiling_high"] * (1 + margin)), p
    assert rep["above"] == sum(p["above"] for p in points.values())
    md = (tmp_path / f"limit-{upstream_artifact.id}.md").read_text()
    assert "in each of 2 server processes" in md and "started again ran up to" in md
