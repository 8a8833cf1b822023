"""Progress on long work: lines where the output is no terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from llamaspec import progress

pytestmark = pytest.mark.unit


def test_long_work_shows_progress_as_lines_where_the_output_is_no_terminal() -> None:
    """A build, bench or tune redirected to a log (CI, nohup) still shows it is moving."""
    out = io.StringIO()
    with progress.bar(Console(file=out, force_terminal=False, width=100)) as bar:
        task = bar.add_task("bench", total=20)
        bar.update(task, description="copy ×1 plain (1)")
        for _ in range(20):
            bar.advance(task)
        bar.update(task, description="copy ×1 spec (1)")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("copy ×1 plain (1): 0/20 steps, ")
    assert sum("plain" in ln for ln in lines) == 11 and lines[-1].startswith(
        "copy ×1 spec (1): 20/20"
    )
    assert isinstance(
        progress.bar(Console(file=io.StringIO(), force_terminal=True)), progress.Progress
    )


def test_a_run_bounded_by_time_still_says_it_is_moving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A soak of 100,000 requests bounded to 30 minutes never reaches its next tenth: a line
    a minute while steps advance says it is alive; no step, no line."""
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    bar = progress.LineProgress(Console(file=out, width=100))
    task = bar.add_task("load", total=100_000)
    bar.update(task, description="load: spec ×4")
    for _ in range(30):  # a request every 10 s for 5 minutes
        now[0] += 10
        bar.advance(task)
    lines = out.getvalue().splitlines()
    assert lines[0] == "load: spec ×4: 0/100000 steps, 0s"
    assert lines[1:] == [f"load: spec ×4: {n}/100000 steps, {n * 10}s" for n in (6, 12, 18, 24, 30)]
    now[0] += 600
    assert out.getvalue().splitlines() == lines  # nothing advanced: nothing said
