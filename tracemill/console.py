"""The commands' tables, printed where they are read: on a terminal at its width; into a pipe or a file (`| less`,
`> report.txt`) at the width their cells need, so that no name from a trace is folded over several lines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

_UNBOUNDED = 1 << 16


def print_table(table: Table) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=Console(width=_UNBOUNDED).measure(table).maximum)
    console.print(table)
