"""Progress on long work: a rich bar on a terminal, and plain lines elsewhere (CI logs, a
redirected run), so that a build, a bench or a tune is seen moving wherever it runs."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LineProgress:
    """The part of rich's Progress llamaspec uses, as lines: one when the description
    changes, one per tenth of the total, and one a minute while steps go on (a run bounded
    by time may never reach its next tenth)."""

    HEARTBEAT = 60.0  # seconds: the longest a log goes without a line while steps advance

    def __init__(self, console: Console) -> None:
        self.console, self.t0 = console, time.monotonic()
        self.description, self.completed, self.total, self.decile = "", 0.0, None, -1
        self.said = self.t0

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> int:
        self.description, self.total = description, total
        return 0

    def update(
        self,
        task: int,
        *,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
    ) -> None:
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        if description is not None and description != self.description:
            self.description = description
            self._say()
        self._tick()

    def advance(self, task: int, advance: float = 1) -> None:
        self.completed += advance
        self._tick()

    def _tick(self) -> None:
        tenth = self.total and int(self.completed * 10 // self.total) != self.decile
        if tenth or time.monotonic() - self.said >= self.HEARTBEAT:
            self._say()

    def _say(self) -> None:
        if self.total:
            self.decile = int(self.completed * 10 // self.total)
        done = f"{self.completed:.0f}/{self.total:.0f} steps, " if self.total else ""
        self.said = time.monotonic()
        self.console.print(f"{self.description}: {done}{time.monotonic() - self.t0:.0f}s")


def bar(console: Console, transient: bool = True) -> Progress | LineProgress:
    """A progress bar for console: rich's on a terminal, lines on anything else."""
    if not console.is_terminal:
        return LineProgress(console)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )
