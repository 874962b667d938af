"""The move engine's decision per message (redrive.operations.verdict), from facts alone:
no SQS, no ledger. One test per fate, and the precedence between them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import Family

from redrive.broker.base import Delivery
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import resolve_family
from redrive.config import built_in_layout
from redrive.ledger import KeyState, SqliteLedger
from redrive.messages import TaskInfo
from redrive.operations.limit import Limit
from redrive.operations.move import MoveEngine, MoveOptions
from redrive.operations.purge import PurgeFate, decide_purge
from redrive.operations.verdict import (
    AMBIGUOUS,
    BUSY,
    EXPIRED,
    IN_DOUBT,
    LEASE_LIVE,
    NO_TARGET,
    NOT_CELERY,
    POISON,
    RESOLVED_SKIP,
    DecisionOptions,
    EntryFacts,
    Fate,
    MessageFacts,
    RunFacts,
    Verdict,
    decide,
    screen,
)
from redrive.sandbox.encoder import encode

RUN = RunFacts(run_id="this-run")
OPTIONS = DecisionOptions()
PLAIN = MessageFacts()
CHARGE = "apps.shop.tasks.charge"


def fate(
    message: MessageFacts = PLAIN,
    entry: EntryFacts | None = None,
    run: RunFacts = RUN,
    **options: object,
) -> Verdict:
    return decide(message, entry, run, DecisionOptions(**options))  # type: ignore[arg-type]


def claimed(by: str = "dead-run", *, live: bool = False) -> EntryFacts:
    return EntryFacts(KeyState.CLAIMED, by, owner_live=live)


def test_a_fresh_key_is_sent() -> None:
    verdict = fate()
    assert verdict == Verdict(Fate.SEND)
    assert verdict.sends and verdict.matched and verdict.skip_reason is None


def test_a_message_the_filters_leave_out_is_not_selected_and_not_counted() -> None:
    verdict = fate(MessageFacts(selected=False, expired=True))
    assert verdict.fate is Fate.NOT_SELECTED
    assert not verdict.matched and verdict.skip_reason is None


def test_an_expired_task_is_skipped_unless_expired_ones_are_included() -> None:
    assert fate(MessageFacts(expired=True)).skip_reason == EXPIRED
    assert fate(MessageFacts(expired=True), include_expired=True).fate is Fate.SEND


def test_a_message_with_no_queue_to_go_to_has_no_target() -> None:
    verdict = fate(MessageFacts(routed=False, celery=False))
    assert (verdict.fate, verdict.skip_reason) == (Fate.NO_TARGET, NO_TARGET)


def test_a_body_celery_cannot_read_stays_out_of_a_celery_queue() -> None:
    assert fate(MessageFacts(celery=False)).skip_reason == NOT_CELERY
    assert fate(MessageFacts(celery=False), include_unknown=True).fate is Fate.SEND
    # A --to queue no Celery worker consumes takes anything.
    assert fate(MessageFacts(celery=False), to_celery=False).fate is Fate.SEND


def test_a_gate_s_reason_skips_the_message_under_that_reason() -> None:
    verdict = fate(MessageFacts(gate="unregistered"))
    assert verdict == Verdict(Fate.GATED, "unregistered")
    assert verdict.skip_reason == "unregistered" and verdict.matched
    # A gate comes first: an unregistered task is that, expired or not.
    assert fate(MessageFacts(gate="unregistered", expired=True)).fate is Fate.GATED


def test_a_held_ambiguous_copy_is_held_before_its_key_decides() -> None:
    sent = EntryFacts(KeyState.SENT, "old-run")
    verdict = fate(MessageFacts(held="same task id", generation=9), sent)
    assert verdict == Verdict(Fate.AMBIGUOUS, "same task id")
    assert verdict.skip_reason == AMBIGUOUS


def test_a_second_copy_in_the_batch_follows_the_first_and_is_counted_later() -> None:
    verdict = fate(MessageFacts(in_batch=True), EntryFacts(KeyState.SENT, "r"))
    assert verdict.fate is Fate.FOLLOWER and not verdict.matched


def test_a_copy_of_a_key_this_dry_run_would_send_is_a_planned_duplicate() -> None:
    verdict = fate(MessageFacts(planned=True))
    assert verdict.fate is Fate.PLANNED_DUPLICATE and verdict.matched
    # The ledger's word comes first.
    assert fate(MessageFacts(planned=True), claimed()).fate is Fate.IN_DOUBT


@pytest.mark.parametrize("state", [KeyState.SENT, KeyState.DONE])
def test_a_copy_of_a_key_sent_is_a_duplicate_even_when_poison(state: KeyState) -> None:
    verdict = fate(MessageFacts(generation=5), EntryFacts(state, "old-run"))
    assert verdict.fate is Fate.DUPLICATE and verdict.skip_reason is None


def test_a_message_redriven_max_redrives_times_is_poison() -> None:
    assert fate(MessageFacts(generation=3)).skip_reason == POISON
    assert fate(MessageFacts(generation=2)).fate is Fate.SEND
    assert fate(MessageFacts(generation=3), max_redrives=4).fate is Fate.SEND


def test_past_the_limit_nothing_more_is_decided_or_counted() -> None:
    full = RunFacts(run_id="this-run", limit_reached=True)
    for entry in (None, claimed(), EntryFacts(KeyState.SKIPPED, "r")):
        verdict = fate(MessageFacts(), entry, full)
        assert verdict.fate is Fate.LIMIT_REACHED and not verdict.matched
    # Duplicates and poison are still told: they send nothing.
    assert fate(MessageFacts(generation=3), None, full).fate is Fate.POISON


def test_a_key_an_operator_resolved_as_skip_stays_skipped() -> None:
    verdict = fate(MessageFacts(), EntryFacts(KeyState.SKIPPED, "r"), in_doubt="resend")
    assert (verdict.fate, verdict.skip_reason) == (Fate.RESOLVED_SKIP, RESOLVED_SKIP)


def test_a_key_claimed_earlier_in_this_run_is_sent_with_its_claim() -> None:
    verdict = fate(MessageFacts(), claimed("this-run"))
    assert verdict.fate is Fate.SEND and verdict.sends


def test_a_key_a_live_run_claimed_is_busy() -> None:
    verdict = fate(MessageFacts(), claimed(live=True), in_doubt="resend")
    assert (verdict.fate, verdict.skip_reason) == (Fate.BUSY, BUSY)


def test_an_in_doubt_key_is_held_and_says_which_run_claimed_it() -> None:
    verdict = fate(MessageFacts(), claimed("dead-run"))
    assert verdict.fate is Fate.IN_DOUBT and verdict.skip_reason == IN_DOUBT
    assert "dead-run" in verdict.detail and not verdict.sends


def test_an_in_doubt_key_is_taken_over_with_resend() -> None:
    verdict = fate(MessageFacts(), claimed("dead-run"), in_doubt="resend")
    assert verdict == Verdict(Fate.TAKEOVER, "dead-run") and verdict.sends


def test_an_in_doubt_key_is_marked_skipped_with_skip() -> None:
    verdict = fate(MessageFacts(), claimed("dead-run"), in_doubt="skip")
    assert verdict == Verdict(Fate.RESOLVE_SKIP, "dead-run")
    assert verdict.skip_reason == RESOLVED_SKIP and not verdict.sends


@pytest.mark.parametrize("policy", ["resend", "skip", "auto"])
def test_an_in_doubt_key_whose_claimant_is_still_leased_stays_in_doubt(policy: str) -> None:
    """Its claimant is dead (its pid gone) but its ledger lease runs: the ledger would
    refuse to resolve it, so the verdict does not pretend to; it names the run, the lease's
    end and what to do."""
    leased = EntryFacts(KeyState.CLAIMED, "dead-run", delivered=True, leased_until=4e9)
    verdict = fate(MessageFacts(), leased, in_doubt=policy)
    assert verdict.fate is Fate.LEASED and verdict.skip_reason == LEASE_LIVE
    assert not verdict.sends and verdict.matched
    assert "dead-run" in verdict.detail and "2096-10-02T07:06:40+00:00" in verdict.detail
    assert "lease" in verdict.detail and "rerun" in verdict.detail


def test_a_leased_claimant_changes_nothing_for_hold_or_an_unproven_auto() -> None:
    leased = EntryFacts(KeyState.CLAIMED, "dead-run", leased_until=4e9)
    assert fate(MessageFacts(), leased).fate is Fate.IN_DOUBT
    assert fate(MessageFacts(), leased, in_doubt="auto").fate is Fate.IN_DOUBT
    live = EntryFacts(KeyState.CLAIMED, "r", owner_live=True, leased_until=4e9)
    assert fate(MessageFacts(), live, in_doubt="skip").fate is Fate.BUSY


def test_an_in_doubt_key_the_result_backend_proves_delivered_is_adopted_with_auto() -> None:
    proven = EntryFacts(KeyState.CLAIMED, "dead-run", delivered=True)
    verdict = fate(MessageFacts(), proven, in_doubt="auto")
    assert verdict == Verdict(Fate.PROVEN, "dead-run")
    assert verdict.matched and not verdict.sends and verdict.skip_reason is None
    assert fate(MessageFacts(), claimed("dead-run"), in_doubt="auto").fate is Fate.IN_DOUBT
    assert fate(MessageFacts(), proven).fate is Fate.IN_DOUBT  # hold: the proof is not asked


def test_a_late_gate_yields_to_expiry() -> None:
    succeeded = MessageFacts(late_gate="already-succeeded")
    assert fate(succeeded) == Verdict(Fate.GATED, "already-succeeded")
    late = MessageFacts(late_gate="already-succeeded", expired=True)
    assert fate(late).fate is Fate.EXPIRED


def test_screen_decides_only_what_needs_no_key() -> None:
    assert screen(MessageFacts(), OPTIONS) is None
    assert screen(MessageFacts(generation=7), OPTIONS) is None  # poison needs the ledger first
    screened = screen(MessageFacts(expired=True), OPTIONS)
    assert screened is not None and screened.fate is Fate.EXPIRED


def test_every_fate_has_a_test() -> None:
    tested = {
        Fate.SEND,
        Fate.NOT_SELECTED,
        Fate.EXPIRED,
        Fate.NO_TARGET,
        Fate.NOT_CELERY,
        Fate.GATED,
        Fate.AMBIGUOUS,
        Fate.FOLLOWER,
        Fate.PLANNED_DUPLICATE,
        Fate.DUPLICATE,
        Fate.POISON,
        Fate.LIMIT_REACHED,
        Fate.RESOLVED_SKIP,
        Fate.BUSY,
        Fate.IN_DOUBT,
        Fate.TAKEOVER,
        Fate.RESOLVE_SKIP,
        Fate.PROVEN,
        Fate.LEASED,
        Fate.CAME_BACK,
        Fate.DIED_DURING_RUN,
    }
    assert tested == set(Fate)


@pytest.mark.parametrize("left", [Fate.CAME_BACK, Fate.DIED_DURING_RUN])
def test_what_this_run_left_for_the_next_is_neither_sent_nor_deleted(left: Fate) -> None:
    """This run's own copy come back, or a message that died after the run began: a new
    key (a new death) would send it, a sent key delete it, poison count it; it is left."""
    message = MessageFacts(left=left, generation=OPTIONS.max_redrives)
    reason = {Fate.CAME_BACK: "came-back", Fate.DIED_DURING_RUN: "died-during-run"}[left]
    for entry in (None, EntryFacts(KeyState.SENT, "this-run"), claimed("this-run")):
        verdict = fate(message, entry)
        assert verdict == Verdict(left)
        assert (verdict.skip_reason, verdict.sends, verdict.matched) == (reason, False, True)
    assert fate(MessageFacts(left=left, expired=True)).fate is Fate.EXPIRED


def test_purge_takes_each_selected_message_while_the_limit_leaves_room() -> None:
    assert decide_purge(selected=True, limit_left=True) is PurgeFate.TAKE
    assert decide_purge(selected=True, limit_left=False) is PurgeFate.LIMIT_REACHED
    assert decide_purge(selected=False, limit_left=True) is PurgeFate.NOT_SELECTED


def test_the_limit_is_taken_one_at_a_time_and_given_back() -> None:
    limit = Limit(2)
    assert not limit.reached and limit.take() and limit.take()
    assert limit.reached and not limit.take()
    limit.give_back()
    assert not limit.reached and limit.take()
    unlimited = Limit(None)
    assert all(unlimited.take() for _ in range(1000)) and not unlimited.reached


def test_a_gate_s_reason_reaches_the_engine_s_counts_and_sends_nothing(
    family: Family, tmp_path: Path
) -> None:
    # How a gate (a task the Celery app does not register, one whose result says it
    # succeeded) slots in: a reason per MessageId, asked once per received batch.
    ids = [family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"g-{i}")) for i in range(4)]
    gated = set(ids[:2])

    class Gated(MoveEngine):
        def _gate_reasons(self, decoded: Sequence[tuple[Delivery, TaskInfo]]) -> dict[str, str]:
            return {m.message_id: "unregistered" for m, _ in decoded if m.message_id in gated}

    target = resolve_family(SqsBroker(family.client), built_in_layout({}).family("checkout"))  # type: ignore[arg-type]
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        result = Gated(
            target,
            ledger,
            MoveOptions(execute=True),
            broker_factory=lambda: SqsBroker(family.client),
        ).run()
    assert (result.matched, result.moved) == (4, 2)
    assert result.skipped == Counter({"unregistered": 2})
    assert result.tasks[CHARGE].skipped == Counter({"unregistered": 2})
    assert family.depth() == (2, 0)  # the gated ones stay in the DLQ, visible
