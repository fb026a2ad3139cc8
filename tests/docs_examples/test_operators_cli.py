"""The shell examples of docs/howto/operators.md, run as written on the real broker.

Each ``console`` block is a list of ``$ python manage.py ...`` lines, each followed by what
the page says it prints. The test runs every command through ``call_command`` (on a
terminal-like stderr, so the progress bar is the page's) against rows of the page's failure
group, and finds each printed line of the page in the command's output, numbers aside (the
page shows 10,000 rows at 200 msg/s; the test sends a few dozen). An option the page uses
that the command does not take fails here first ("unrecognized arguments").
"""

from __future__ import annotations

import io
import re
import shlex
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.management import call_command

from django_rmq_retry.models import ParkedMessage, ParkedStatus
from tests.conftest import ROOT, Child, read_log, start_consumer
from tests.test_operations import park_rows

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PAGE = ROOT / "docs" / "howto" / "operators.md"
#: The failure group the page's examples select.
GROUP = "KeyError at shop/receipts.py:send"


@dataclass
class Step:
    argv: list[str]  # after "python manage.py"
    shown: list[str] = field(default_factory=list)  # the lines the page says it prints


def console_blocks(path: Path) -> list[list[Step]]:
    """The ``console`` blocks of ``path``: their commands (continuation lines joined,
    comments dropped) and the output shown under each."""
    blocks = re.findall(r"```console\n(.*?)```", path.read_text(), flags=re.DOTALL)
    out = []
    for block in blocks:
        steps: list[Step] = []
        pending = ""
        for line in block.splitlines():
            if pending or line.startswith("$ "):
                pending += line.removeprefix("$ ").rstrip()
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                    continue
                argv = shlex.split(pending, comments=True)
                pending = ""
                assert argv[:2] == ["python", "manage.py"], argv
                steps.append(Step(argv[2:]))
            elif line.strip():
                steps[-1].shown.append(line)
        out.append(steps)
    return out


def shape(line: str) -> str:
    """A line with its numbers, bar and spacing made general."""
    line = re.sub(r"\[[#.]+\]", "[BAR]", line)
    line = re.sub(r"\d[\d,]*(\.\d+)?", "N", line)
    return " ".join(line.split())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(step: Step, ids: dict[str, str]) -> list[str]:
    """Run one example (the page's operation ids read as the ones this run made); its
    printed lines (the bar's redraws split apart)."""
    argv = [ids.get(arg, arg) for arg in step.argv]
    out, err = io.StringIO(), Terminal()
    call_command(*argv, stdout=out, stderr=err)
    printed = re.split(r"[\r\n]+", out.getvalue() + "\n" + err.getvalue())
    for shown in step.shown:
        made = re.search(r"^Requeue operation #(\d+)", shown)
        if made:
            real = re.search(r"^Requeue operation #(\d+)", out.getvalue(), flags=re.MULTILINE)
            assert real, out.getvalue()
            ids[made.group(1)] = real.group(1)
    return printed


def assert_shown(step: Step, printed: list[str]) -> None:
    shapes = {shape(line) for line in printed if line.strip()}
    missing = [line for line in step.shown if shape(line) not in shapes]
    assert not missing, (step.argv, missing, printed)


@contextmanager
def consumer(rmq) -> Iterator[Child]:
    child = start_consumer(rmq.prefix, rmq.log, "alpha")
    try:
        yield child
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)


def group_rows(rmq, ids: range) -> None:
    rows = park_rows(rmq, [{"id": i} for i in ids])
    ParkedMessage.objects.filter(pk__in=[r.pk for r in rows]).update(fingerprint=GROUP)


def test_the_pages_shell_examples_run_as_shown(rmq):
    first, second = console_blocks(PAGE)[:2]
    assert [s.argv[0] for s in first] == ["rmq_requeue", "rmq_requeue"]
    assert all(GROUP in s.argv for s in first)
    group_rows(rmq, range(40))
    park_rows(rmq, [{"id": 1000}])  # another group: not selected
    ids: dict[str, str] = {}

    # A dry run, then an operation this command steps (a consumer reports the outcomes).
    with consumer(rmq):
        for step in first:
            assert_shown(step, run(step, ids))
    assert ParkedMessage.objects.filter(fingerprint=GROUP, status=ParkedStatus.PARKED).count() == 0

    # Detached, paused while nobody steps it, listed, resumed, stepped here.
    group_rows(rmq, range(100, 130))
    resume = next(i for i, s in enumerate(second) if "--resume" in s.argv)
    for step in second[:resume]:
        assert_shown(step, run(step, ids))
    with consumer(rmq):
        for step in second[resume:]:
            assert_shown(step, run(step, ids))

    handled = Counter(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert handled == Counter([*range(40), *range(100, 130)])  # each once, the rest untouched
    assert ParkedMessage.objects.filter(status=ParkedStatus.PARKED).count() == 1
