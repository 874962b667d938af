"""``redrive ledger resolve`` in memory that does not grow with the keys in doubt (issue 40):
the evidence gathered, the resolutions decided, done and rendered a page at a time, the
output the very text it was when every resolution was kept and printed at once.

Shown by counting, never by timing: the resolutions alive while a page is handed on, and
the peak of what Python allocates (tracemalloc) for 1,000 and for 10,000 keys in doubt.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from conftest import Cli
from test_e2e import ROOT

from redrive.ledger import Claim, SqliteLedger
from redrive.operations.resolve import (
    PAGE,
    Action,
    Choices,
    Resolution,
    resolve_in_doubt,
    resolve_in_doubt_paged,
)
from redrive.render.resolve import resolve_text

TARGET = "https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout"
# A name with what JSON leaves unescaped and str.splitlines splits at (U+2028), quotes and
# a character outside ASCII: the streamed document must still be the whole one's text.
ODD_TASK = 'apps.tasks.charge\u2028"Zoë"'

# The CLI in a process of its own, its allocations traced from just before the command (the
# modules it needs imported already): the peak on stderr, whatever the command's exit.
PEAK = """
import sys, tracemalloc
from redrive.cli import main
sys.argv = ["redrive", *sys.argv[1:]]
tracemalloc.start()
try:
    main()
finally:
    print("peak", tracemalloc.get_traced_memory()[1], file=sys.stderr)
"""


def in_doubt(path: Path, n: int, *, task: str = "apps.tasks.charge") -> None:
    """A SQLite ledger with ``n`` keys in doubt: claimed by a run that failed (ended) before
    any send was confirmed."""
    with SqliteLedger(path) as ledger:
        ledger.start_run("dead", command="move", info={})
        for start in range(0, n, 500):
            claims = [
                Claim(f"celery:t-{i}:r0:g0:abcd1234:b{i:016x}", task, f"m-{i}", TARGET)
                for i in range(start, min(n, start + 500))
            ]
            ledger.claim_many("dead", claims)
        ledger.end_run("dead", outcome="failed", counts={})


def test_a_paged_resolve_keeps_at_most_a_page_of_resolutions_alive(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    in_doubt(path, 10_000)
    alive: list[int] = []

    def on_page(page: Sequence[Resolution]) -> None:
        alive.append(sum(isinstance(o, Resolution) for o in gc.get_objects()))

    with SqliteLedger(path) as ledger:
        tally = resolve_in_doubt_paged(ledger, Choices(), execute=False, on_page=on_page)

    assert (tally.in_doubt, tally.count(Action.LEAVE), tally.left) == (10_000, 10_000, 10_000)
    assert len(alive) == 10_000 // PAGE
    assert max(alive) <= PAGE, "a page's resolutions, and no more, are alive at a time"


def _peak(path: Path, out: Path, *args: str) -> int:
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-c", PEAK, "ledger", "resolve", "--ledger", str(path), *args],
            cwd=ROOT,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr
    return int(done.stderr.split("peak ")[-1])


def test_the_clis_resolve_of_ten_times_the_keys_in_doubt_takes_no_more_memory(
    tmp_path: Path,
) -> None:
    """``ledger resolve --json`` (and its text) of 10,000 keys in doubt: its peak of traced
    memory stays within 1 MB of the same command's for 1,000 (kept whole, 9,000 more
    resolutions, their evidence and their JSON took tens of MB), and the output is all
    there."""
    peaks: dict[tuple[int, str], int] = {}
    for n in (1_000, 10_000):
        path = tmp_path / f"ledger-{n}.sqlite3"
        in_doubt(path, n)
        for form in ("json", "text"):
            out = tmp_path / f"{n}.{form}"
            peaks[n, form] = _peak(path, out, *(["--json"] if form == "json" else []))
            if form == "json":
                document = json.loads(out.read_text())
                assert (document["in_doubt"], len(document["messages"])) == (n, n)
            else:
                assert f"{n} in doubt in ledger" in out.read_text()
    print({k: f"{v / 1e6:.2f} MB" for k, v in peaks.items()})
    for form in ("json", "text"):
        assert peaks[10_000, form] < peaks[1_000, form] + 1_000_000, peaks


def test_the_paged_output_is_the_text_the_whole_result_printed(tmp_path: Path, cli: Cli) -> None:
    """Three pages and a bit of keys, with an awkward task name: ``--json`` and the text,
    streamed, are byte for byte what the kept result printed at once was."""
    path = tmp_path / "ledger.sqlite3"
    in_doubt(path, 2 * PAGE + 50, task=ODD_TASK)
    with SqliteLedger(path) as ledger:
        whole = resolve_in_doubt(ledger, Choices(skip=frozenset({"t-7", "gone"})), execute=False)
    base = ("ledger", "resolve", "--ledger", str(path), "--skip", "t-7", "--skip", "gone")

    as_json = cli(*base, "--json")
    text = cli(*base)

    assert as_json.exit_code == 0 and text.exit_code == 0, (as_json.output, text.output)
    expected = json.dumps(whole.to_json(), indent=2, ensure_ascii=False) + "\n"
    assert as_json.stdout == expected
    again = f"redrive ledger resolve --skip t-7 --skip gone --ledger {path} --execute"
    assert text.stdout == resolve_text(whole, again=again) + "\n"
    assert json.loads(as_json.stdout)["unmatched"] == ["gone"]
    assert whole.count(Action.SKIP) == 1
    assert json.dumps(ODD_TASK, ensure_ascii=False) in as_json.stdout, "written raw, as before"


def test_nothing_in_doubt_prints_as_it_did(tmp_path: Path, cli: Cli) -> None:
    path = tmp_path / "ledger.sqlite3"
    in_doubt(path, 0)
    with SqliteLedger(path) as ledger:
        whole = resolve_in_doubt(ledger, Choices(), execute=False)

    as_json, text = (
        cli("ledger", "resolve", "--ledger", str(path), "--json"),
        cli("ledger", "resolve", "--ledger", str(path)),
    )

    assert as_json.stdout == json.dumps(whole.to_json(), indent=2, ensure_ascii=False) + "\n"
    assert text.stdout == f"nothing in doubt in ledger {whole.ledger}\n"
