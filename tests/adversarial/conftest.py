"""The adversarial suite's count table, printed at the end of the session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.adversarial.harness import ROWS, format_table


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("adversarial count table")
    for line in format_table(ROWS):
        terminalreporter.write_line(line)
    out = os.environ.get("ADV_TABLE_FILE")
    if out:
        Path(out).write_text("\n".join(format_table(ROWS)) + "\n")
