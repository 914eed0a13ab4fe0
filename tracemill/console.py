"""What commands print, laid out where it is read: on a terminal at its width; into a pipe or a file (`| less`,
`> report.txt`, `| tee`) with each line whole and each table as wide as its cells need, so that no name from a trace
is folded over several lines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

_UNBOUNDED = 1 << 16


def text_console() -> Console:
    """A console for a command's lines: on a terminal, folded at its width; elsewhere never folded."""
    console = Console()
    return console if console.is_terminal else Console(soft_wrap=True)


def print_table(table: Table, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:
        console = Console(file=console.file, width=Console(width=_UNBOUNDED).measure(table).maximum)
    console.print(table)


def print_rule(console: Console, title: str) -> None:
    """A rule with a title (markup): elsewhere than on a terminal as wide as the title needs, never cut short."""
    if not console.is_terminal:
        console = Console(file=console.file, width=max(console.width, Text.from_markup(title).cell_len + 6))
    console.rule(title)
