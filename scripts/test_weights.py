"""The weights ``scripts/test.sh`` splits the ordinary suite by (``test-weights.txt``).

The oldest and newest legs each run their ordinary test files in two halves side by side.
Taking the files in turn by name made one half minutes longer than the other as slow files
were added; the halves are now balanced by how long each file took in a recorded run.

    python scripts/test_weights.py split LEG N FILE...   # the files of half N (0 or 1)
    python scripts/test_weights.py record LOGS_DIR       # rewrite the weights from a run

``record`` reads the JUnit reports a full ``scripts/test.sh`` run leaves in its logs
(``oldest.xml``, ``oldest-2.xml``, ``newest.xml``, ``newest-2.xml``) and writes each file's
seconds per leg. ``split`` deals the files out heaviest first, each to the lighter half so
far; a file with no recorded weight (a new one) weighs the median, so the split works the
day a file is added and improves once the weights are recorded again. Deterministic: both
halves compute the same split.
"""

from __future__ import annotations

import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

WEIGHTS = Path(__file__).with_name("test-weights.txt")
LEGS = ("oldest", "newest")


def load(path: Path = WEIGHTS) -> dict[str, dict[str, float]]:
    """``{leg: {file: seconds}}`` from the weights file (empty if it is missing)."""
    weights: dict[str, dict[str, float]] = {leg: {} for leg in LEGS}
    if not path.exists():
        return weights
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 1 + len(LEGS) or line.startswith("#"):
            continue
        for leg, seconds in zip(LEGS, parts[1:], strict=True):
            weights[leg][parts[0]] = float(seconds)
    return weights


def split(weights: dict[str, float], files: list[str], half: int) -> list[str]:
    """The files of ``half``: heaviest first, each to the half with less weight so far."""
    known = [weights[f] for f in files if f in weights]
    default = statistics.median(known) if known else 1.0
    sums = [0.0, 0.0]
    chosen: list[list[str]] = [[], []]
    for f in sorted(files, key=lambda f: (-weights.get(f, default), f)):
        side = 0 if sums[0] <= sums[1] else 1
        chosen[side].append(f)
        sums[side] += weights.get(f, default)
    return sorted(chosen[half])


def file_of(case: ET.Element) -> str | None:
    """A test case's file, from its ``file`` attribute or its dotted ``classname``."""
    if case.get("file"):
        return case.get("file")
    classname = case.get("classname") or ""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = Path(*parts[:end]).with_suffix(".py")
        if candidate.exists():
            return str(candidate)
    return None


def record(logs: Path) -> None:
    seconds: dict[str, dict[str, float]] = {leg: defaultdict(float) for leg in LEGS}
    for leg in LEGS:
        for part in (leg, f"{leg}-2"):
            report = logs / f"{part}.xml"
            if not report.exists():
                sys.exit(f"{report} is missing: record after a full scripts/test.sh run")
            for case in ET.parse(report).iter("testcase"):
                name = file_of(case)
                if name is not None:
                    seconds[leg][name] += float(case.get("time") or 0)
    files = sorted(set().union(*(seconds[leg] for leg in LEGS)))
    lines = [
        "# Seconds each ordinary test file took per leg in a full scripts/test.sh run",
        "# (python scripts/test_weights.py record .test-logs). test.sh balances halves by it.",
    ]
    lines += [f"{f} " + " ".join(f"{seconds[leg].get(f, 0.0):.1f}" for leg in LEGS) for f in files]
    WEIGHTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {WEIGHTS} ({len(files)} files)")


def main(argv: list[str]) -> None:
    if argv[:1] == ["split"] and len(argv) >= 3:
        leg, half, files = argv[1], int(argv[2]), argv[3:]
        print("\n".join(split(load()[leg], files, half)))
    elif argv[:1] == ["record"] and len(argv) == 2:
        record(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
