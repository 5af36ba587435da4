"""Progress bars for the CLI's long work (``sweep --once``, ``audit``, ``config apply``).

Drawn on standard error, and only for a person at a terminal: when standard error is not a
TTY (a script, a pipe, CI) or ``TERM=dumb``, nothing is drawn and the output is byte for byte
what it was without a bar. The bar is transient: it is erased when the work is done, so only
the command's result stays on the screen.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


class Progress(Protocol):
    def advance(self, amount: int = 1) -> None:
        """Count ``amount`` more units of work done."""

    def describe(self, text: str) -> None:
        """Change what the bar says it is doing."""


def wanted(stream: TextIO | None = None) -> bool:
    """Whether to draw a bar on ``stream`` (standard error by default): only on a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class _Silent:
    def advance(self, amount: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class _Drawn:
    def __init__(self, progress: RichProgress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task, amount)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)


@contextmanager
def bar(description: str, total: int | None, *, enabled: bool | None = None) -> Iterator[Progress]:
    """A bar over ``total`` units (None: not known, the bar pulses); a silent stand-in when
    ``enabled`` is false (by default: unless :func:`wanted`)."""
    if not (wanted() if enabled is None else enabled):
        yield _Silent()
        return
    # rich is imported only when a bar is drawn: scripts never pay for it.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        ProgressColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress

    columns: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
    if total is not None:
        columns.append(MofNCompleteColumn())
    columns.append(TimeElapsedColumn())
    with RichProgress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield _Drawn(progress, task)
