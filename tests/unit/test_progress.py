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
