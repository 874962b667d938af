"""A selected message on its way through a move (a :class:`Candidate`: its key, where it goes
and how it goes there) and a received batch as decided (a :class:`DecidedBatch`: what each
message is to become, before anything is claimed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from redrive.broker.base import Delivery, QueueRef
from redrive.keys import key_for, legacy_key_for
from redrive.ledger import Entry
from redrive.messages import TaskInfo
from redrive.operations.verdict import Fate, Verdict


@dataclass(slots=True)
class Candidate:
    """A selected message on its way: its key, where it goes and how it goes there."""

    message: Delivery
    info: TaskInfo
    key: str
    generation: int
    target: QueueRef
    namespace: str
    """The broker's key namespace (``Capabilities.key_namespace``)."""
    legacy_key: str | None = None
    """Its key in the form before keys named the publish, when the ledger may hold those."""
    held: str | None = None
    """Why it is held as an ambiguous copy (it shares a key, and nothing tells a copy of
    that task from a second publish)."""
    left: Fate | None = None
    """Fate.CAME_BACK (this run's own copy, come back) or Fate.DIED_DURING_RUN: left in the
    DLQ for the next run, whatever its key says."""
    body: str | None = None
    """The body to send when edits changed it (issue 26); None: the message's own. The key
    is always the original's."""

    @property
    def tagged(self) -> bool:
        return self.info.delivery_tag is not None

    def rekey(self, *, by_message: bool = False) -> None:
        self.key = key_for(
            self.info,
            message_id=self.message.message_id,
            generation=self.generation,
            body=self.message.body,
            namespace=self.namespace,
            by_message=by_message,
        )
        if self.legacy_key is not None:
            self.legacy_key = legacy_key_for(
                self.info,
                message_id=self.message.message_id,
                generation=self.generation,
                namespace=self.namespace,
            )

    def keys_at(self, generation: int) -> list[str]:
        """The keys it would have at ``generation``: its own, and its legacy one if it has one."""
        info, message = self.info, self.message
        ns, mid = self.namespace, message.message_id
        keys = [
            key_for(info, message_id=mid, generation=generation, body=message.body, namespace=ns)
        ]
        if self.legacy_key is not None:
            keys.append(legacy_key_for(info, message_id=mid, generation=generation, namespace=ns))
        return keys


def candidate_for(
    message: Delivery,
    info: TaskInfo,
    generation: int,
    route: QueueRef,
    namespace: str,
    *,
    legacy: bool,
) -> Candidate:
    """A selected message as a candidate, keyed; with its legacy key too when ``legacy`` (the
    ledger may hold keys of the earlier form) and it is a task."""
    mid = message.message_id
    key = key_for(
        info, message_id=mid, generation=generation, body=message.body, namespace=namespace
    )
    legacy_key = (
        legacy_key_for(info, message_id=mid, generation=generation, namespace=namespace)
        if legacy and info.task_id
        else None
    )
    return Candidate(message, info, key, generation, route, namespace, legacy_key)


@dataclass(slots=True)
class DecidedBatch:
    """A batch decided on and not yet claimed: what each message is to become."""

    batch: Sequence[Delivery]
    received_at: float
    keep: list[Delivery]
    to_send: list[Candidate] = field(default_factory=list)
    takeovers: list[tuple[Candidate, str]] = field(default_factory=list)
    duplicates: list[tuple[Candidate, str]] = field(default_factory=list)  # (copy, key sent)
    followers: dict[str, list[Candidate]] = field(default_factory=dict)
    """Key -> further copies of that key in this batch: they follow the first copy."""
    resolve_skip: list[tuple[Candidate, str]] = field(default_factory=list)
    proven: list[tuple[Candidate, str]] = field(default_factory=list)
    """In doubt, and proven delivered by the result backend (--in-doubt auto): (copy, the
    dead run that claimed it); also in ``duplicates``, to be deleted."""

    def add(self, cand: Candidate, verdict: Verdict, entry: Entry | None) -> None:
        """Put a candidate where its verdict says."""
        fate = verdict.fate
        if fate is Fate.FOLLOWER:
            self.followers[cand.key].append(cand)
        elif fate is Fate.SEND:
            self.followers[cand.key] = []
            self.to_send.append(cand)
        elif fate is Fate.TAKEOVER and entry is not None:
            self.followers[cand.key] = []
            self.takeovers.append((cand, entry.run_id))
        elif fate is Fate.DUPLICATE and entry is not None:
            self.duplicates.append((cand, entry.key))
        elif fate is Fate.PROVEN and entry is not None:
            self.duplicates.append((cand, entry.key))
            self.proven.append((cand, entry.run_id))
        elif fate is Fate.RESOLVE_SKIP and entry is not None:
            self.resolve_skip.append((cand, entry.run_id))
            self.keep.append(cand.message)
        else:
            self.keep.append(cand.message)

    def keep_with_followers(self, cand: Candidate) -> list[Candidate]:
        """Keep a candidate that is not sent hidden, with the further copies of its key
        (returned: they are counted as it is)."""
        followers = self.followers.pop(cand.key, [])
        self.keep.append(cand.message)
        self.keep.extend(f.message for f in followers)
        return followers
