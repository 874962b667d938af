"""The audit trail: who ran which ``--execute`` command, when, on what, and how it ended.

Runs are recorded in the ledger (the SQLite file, or the DynamoDB table), beside the keys
they moved, so the trail is wherever the ledger is and needs no second store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redrive.aws.identity import local_identity
from redrive.durations import iso_utc
from redrive.errors import RedriveError
from redrive.ledger import Entry, Ledger, RunInfo
from redrive.runs.lifecycle import audit_record


def run_record(
    *,
    command_line: str,
    target: str,
    filters: Mapping[str, Any],
    ledger: str,
    archive: str | None,
    caller: Mapping[str, str],
    sqs_client: str | None = None,
    broker_server: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What an ``--execute`` run of this OS user records about itself when it starts
    (:func:`redrive.runs.lifecycle.audit_record`)."""
    return audit_record(
        command_line=command_line,
        target=target,
        filters=filters,
        ledger=ledger,
        archive=archive,
        identity=local_identity(),
        caller=caller,
        sqs_client=sqs_client,
        broker_server=broker_server,
    )


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunInfo
    keys: list[Entry]


def list_runs(ledger: Ledger, *, since: float | None) -> list[RunInfo]:
    """The commands' runs, newest first. The processes of a ``--processes`` run have runs of
    their own (their claims are theirs): they are folded into their parent's, which records
    the command and its summed counts."""
    runs = [r for r in ledger.runs(since=since) if not _child_of(r)]
    return sorted(runs, key=lambda r: r.started_at, reverse=True)


def _child_of(run: RunInfo) -> str | None:
    parent = (run.info or {}).get("parent")
    return parent if isinstance(parent, str) else None


def find_run(ledger: Ledger, run_id: str) -> RunInfo:
    """The run ``run_id`` names: its id, or a prefix of one command's run id."""
    run = ledger.run(run_id)
    if run is None:
        matches = [r for r in ledger.runs() if r.run_id.startswith(run_id) and not _child_of(r)]
        if len(matches) != 1:
            raise RedriveError(
                f"no run {run_id} in the ledger {ledger.location}: `redrive audit` lists them"
            )
        run = matches[0]
    return run


def own_runs(ledger: Ledger, run: RunInfo) -> list[str]:
    """The ids of the runs whose keys are ``run``'s: its own and, for a --processes run,
    its processes' (runs PARENT.1, PARENT.2, ...)."""
    children = [
        child.run_id
        for child in ledger.runs(since=run.started_at - 1)
        if _child_of(child) == run.run_id
    ]
    return [run.run_id, *children]


def show_run(ledger: Ledger, run_id: str) -> RunDetail:
    run = find_run(ledger, run_id)
    keys = [key for owner in own_runs(ledger, run) for key in ledger.keys_for_run(owner)]
    return RunDetail(run=run, keys=keys)


def run_json(run: RunInfo) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "command": run.command,
        "started_at": iso_utc(run.started_at),
        "ended_at": iso_utc(run.ended_at),
        "outcome": run.outcome or "running or crashed",
        "info": run.info,
        "counts": run.counts,
        **_deleted_cut(run),
    }


def _deleted_cut(run: RunInfo) -> dict[str, Any]:
    """How much of what a purge deleted its record lists (the first
    :data:`~redrive.operations.purge.engine.DELETED_KEPT`), as every capped list in the JSON
    says it: ``deleted_listed`` and ``deleted_truncated``."""
    deleted = (run.info or {}).get("deleted")
    if not isinstance(deleted, list):
        return {}
    total = run.counts.get("purged", len(deleted))
    total = total if isinstance(total, int) else len(deleted)
    return {"deleted_listed": len(deleted), "deleted_truncated": total > len(deleted)}


def entry_json(entry: Entry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "state": str(entry.state),
        "task": entry.task,
        "message_id": entry.message_id,
        "target": entry.target,
        "sent_message_id": entry.sent_message_id,
        "updated_at": iso_utc(entry.updated_at),
    }
