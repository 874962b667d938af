"""RabbitMQ's side of turning a TARGET into a DLQ and its source queues.

A queue dead-letters per its arguments (``x-dead-letter-exchange``,
``x-dead-letter-routing-key``), else its effective policy (``dead-letter-exchange``,
``dead-letter-routing-key``); with no routing key set, a message keeps its own (for Celery:
the queue's name). Its DLQ is the queue the DLX routes that key to, found by the DLX's
bindings (the default exchange ``""``: the queue of that name). Queues are named within their
vhost, as x-death names them: a queue's ident is ``<vhost>/<name>``.

A queue's policy is worked out from the vhost's policies (:meth:`Queues.effective_policy`),
not read from the queue's ``effective_policy_definition``: that field is a statistic, which
lags a new queue or a policy change by the statistics interval (5 s by default; measured
here: a quorum DLQ declared under a ``delivery-limit`` policy showed none, and was read).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeGuard

from redrive.broker.base import DlqTarget, QueueRef, queue_name
from redrive.broker.rabbitmq.api import ManagementApi
from redrive.broker.rabbitmq.limits import DeliveryLimit, effective_limit
from redrive.errors import BrokerUnavailable, NoDeadLetterQueue, QueueNotFound

if TYPE_CHECKING:
    from redrive.broker.base import Broker
    from redrive.config import Family, Layout


Policies: TypeAlias = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""A vhost's policies and operator policies, as the management API lists them."""
Policy: TypeAlias = dict[str, Any]
"""One policy as the management API lists it (name, pattern, definition...), ``{}``: none."""


@dataclass(frozen=True, slots=True)
class DeadLettering:
    """Where a queue dead-letters: its DLX and the routing key dead messages carry."""

    exchange: str
    routing_key: str
    queues: tuple[str, ...]
    """The queues the DLX routes that key to."""


class Queues:
    """Queue discovery on one vhost through the management API."""

    def __init__(self, api: ManagementApi, vhost: str) -> None:
        self.api = api
        self.vhost = vhost
        self._version: tuple[str] | None = None

    def ident(self, name: str) -> str:
        return f"{self.vhost}/{name}"

    def name_of(self, name_or_address: str) -> str:
        prefix = f"{self.vhost}/"
        if name_or_address.startswith(prefix):
            return name_or_address[len(prefix) :]
        return name_or_address

    def raw(self, name: str) -> dict[str, Any]:
        found = self.api.get("queues", self.vhost, name)
        if not isinstance(found, dict):
            self.vhost_exists()
            raise QueueNotFound(f"queue {name} does not exist on vhost {self.vhost!r}")
        return found

    def vhost_exists(self) -> None:
        """A queue not found on a vhost the API does not know is a vhost not there (every
        queue would be missing): said so, once, rather than as each family's queue."""
        if self.api.get("vhosts", self.vhost) is None:
            raise BrokerUnavailable(
                f"vhost {self.vhost!r} does not exist on RabbitMQ (the management API at "
                f"{self.api.masked} knows none of that name for user {self.api.user!r}): "
                "check the vhost, the broker URL's path (amqp://USER:PASS@HOST:5672/VHOST; "
                "`//` is the default vhost '/')"
            )

    def describe(self, name_or_address: str, policies: Policies | None = None) -> QueueRef:
        """``policies``: the vhost's, when the caller listed them already."""
        name = self.name_of(name_or_address)
        raw = self.raw(name)
        args = raw.get("arguments") or {}
        chosen = self._chosen_policies(name, raw, policies)
        policy = _statistic(raw) if chosen is None else _merged(*chosen)
        letting = self.dead_lettering(name, args, policy)
        target: str | None = None
        if letting is not None:
            target = self.ident(letting.queues[0]) if len(letting.queues) == 1 else ""
        limit = self.delivery_limit(raw, chosen)
        ttl = args.get("x-message-ttl", policy.get("message-ttl"))
        return QueueRef(
            url=self.ident(name),
            name=name,
            ident=self.ident(name),
            fifo=False,
            dead_letter_target=target,
            max_receive_count=limit.value if limit is not None else None,
            retention_seconds=int(ttl) // 1000 if isinstance(ttl, int) else None,
            receive_limit_origin=limit.origin if limit is not None else "",
        )

    def delivery_limit(
        self, raw: Mapping[str, Any], chosen: tuple[Policy, Policy] | None
    ) -> DeliveryLimit | None:
        """The queue's delivery limit and where it comes from (:mod:`.limits`), of its
        argument and its policies (``chosen``; None: only the statistic tells)."""
        kind = str(raw.get("type") or "classic")
        found: list[DeliveryLimit] = []
        argument = (raw.get("arguments") or {}).get("x-delivery-limit")
        if _is_int(argument):
            found.append(DeliveryLimit(argument, " as its own argument"))
        policy = _policy_limit(raw, chosen)
        if policy is not None:
            found.append(policy)
        # The version matters only to a quorum queue: others make no call for it.
        version = self.server_version() if kind == "quorum" else None
        return effective_limit(found, version, kind)

    def server_version(self) -> str | None:
        """The server's ``rabbitmq_version`` (``/api/overview``), asked once."""
        if self._version is None:
            overview = self.api.get("overview")
            found = overview.get("rabbitmq_version") if isinstance(overview, dict) else None
            self._version = (str(found),) if found else ("",)
        return self._version[0] or None

    def policies(self) -> Policies | None:
        """The vhost's policies and operator policies (any user who may read the vhost's
        queues may list them, a ``management`` user included); None when the API has no
        such listing (then only the statistic tells)."""
        regular = self.api.get("policies", self.vhost)
        if not isinstance(regular, list):
            return None
        operator = self.api.get("operator-policies", self.vhost)
        return regular, operator if isinstance(operator, list) else []

    def effective_policy(
        self, name: str, raw: Mapping[str, Any], policies: Policies | None = None
    ) -> dict[str, Any]:
        """The definition RabbitMQ applies to queue ``name``, as it works it out: of the
        policies whose pattern matches the name (a search, not a full match) and whose
        ``apply-to`` takes the queue, the one of highest priority; merged with the operator
        policy chosen the same way, the lower of two numbers winning. Where the policies
        cannot be listed, or a pattern is not one Python reads, the queue's statistic."""
        chosen = self._chosen_policies(name, raw, policies)
        return _statistic(raw) if chosen is None else _merged(*chosen)

    def _chosen_policies(
        self, name: str, raw: Mapping[str, Any], policies: Policies | None
    ) -> tuple[Policy, Policy] | None:
        """The policy and the operator policy RabbitMQ applies to queue ``name`` (each
        ``{}``: none); None where the policies cannot be listed or a pattern read."""
        listed = policies if policies is not None else self.policies()
        if listed is None:
            return None
        kind = str(raw.get("type") or "classic")
        try:
            regular, operator = (_chosen(found, name, kind) for found in listed)
        except re.error:
            return None
        return regular, operator

    def dead_lettering(
        self, name: str, args: Mapping[str, Any], policy: Mapping[str, Any]
    ) -> DeadLettering | None:
        exchange = args.get("x-dead-letter-exchange", policy.get("dead-letter-exchange"))
        if exchange is None:
            return None
        key = args.get("x-dead-letter-routing-key", policy.get("dead-letter-routing-key"))
        routing_key = str(key) if key is not None else name
        return DeadLettering(str(exchange), routing_key, self.routed(str(exchange), routing_key))

    def routed(self, exchange: str, routing_key: str) -> tuple[str, ...]:
        """The queues ``exchange`` routes ``routing_key`` to (by its bindings)."""
        if exchange == "":
            return (
                (routing_key,)
                if isinstance(self.api.get("queues", self.vhost, routing_key), dict)
                else ()
            )
        info = self.api.get("exchanges", self.vhost, exchange)
        if not isinstance(info, dict):
            return ()
        kind = str(info.get("type", "direct"))
        bindings = self.api.get("exchanges", self.vhost, exchange, "bindings", "source") or []
        names: set[str] = set()
        for binding in bindings:
            if binding.get("destination_type") != "queue":
                continue
            if _routes(kind, str(binding.get("routing_key", "")), routing_key):
                names.add(str(binding["destination"]))
        return tuple(sorted(names))

    def dlq_of(self, source: QueueRef) -> QueueRef:
        raw = self.raw(source.name)
        letting = self.dead_lettering(
            source.name, raw.get("arguments") or {}, self.effective_policy(source.name, raw)
        )
        if letting is None:
            raise NoDeadLetterQueue(
                f"queue {source.name} has no x-dead-letter-exchange (argument or policy), so "
                "it has no DLQ: name the DLQ itself, or set `dlq` for its family in the config"
            )
        shown = f"exchange {letting.exchange!r} for routing key {letting.routing_key!r}"
        if not letting.queues:
            raise NoDeadLetterQueue(
                f"queue {source.name} dead-letters to {shown}, which routes it to no queue: "
                "its dead messages vanish; bind a DLQ to the exchange for that key"
            )
        if len(letting.queues) > 1:
            raise NoDeadLetterQueue(
                f"queue {source.name} dead-letters to {shown}, which routes it to "
                f"{len(letting.queues)} queues ({', '.join(letting.queues)}): name the DLQ "
                "itself, or set `dlq` for its family in the config"
            )
        return self.describe(letting.queues[0])

    def names(self, prefix: str = "") -> list[str]:
        listed = self.api.get("queues", self.vhost, query="columns=name") or []
        return sorted(str(q["name"]) for q in listed if str(q.get("name", "")).startswith(prefix))

    def sources_of(self, dlq: QueueRef) -> list[QueueRef]:
        """The queues of the vhost that dead-letter into ``dlq``."""
        found = []
        policies = self.policies()
        for name in self.names():
            if name == dlq.name:
                continue
            try:
                queue = self.describe(name, policies)
            except QueueNotFound:
                continue  # deleted since listed
            if queue.dead_letter_target == dlq.ident:
                found.append(queue)
        return found

    def resolve_family(self, family: Family) -> DlqTarget:
        try:
            source = self.describe(family.queue)
        except QueueNotFound:
            raise QueueNotFound(
                f"family {family.name}: queue {family.queue} does not exist on vhost "
                f"{self.vhost!r}: check the name, --broker and the layout (config file or "
                "CELERY_*_QUEUE)"
            ) from None
        if family.dlq:
            try:
                dlq = self.describe(family.dlq)
            except QueueNotFound:
                raise QueueNotFound(
                    f"family {family.name}: DLQ {family.dlq} does not exist: fix `dlq` in the "
                    "config"
                ) from None
        else:
            dlq = self.dlq_of(source)
        return DlqTarget(label=family.name, family=family, dlq=dlq, sources=(source,))

    def resolve(
        self, layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
    ) -> DlqTarget:
        family = layout.family(target)
        if family is not None:
            return broker_for(family.region).resolve_family(family)
        try:
            queue = self.describe(target)
        except QueueNotFound:
            known = ", ".join(f.name for f in layout.families)
            raise QueueNotFound(
                f"'{target}' is neither a family ({known}) nor an existing queue on vhost "
                f"{self.vhost!r}: check the name, --broker and --config"
            ) from None
        for fam in layout.families:
            names = {queue_name(fam.queue), *([queue_name(fam.dlq)] if fam.dlq else [])}
            if queue.name in names:
                return self.resolve_family(fam)
        if queue.dead_letter_target is not None:
            return DlqTarget(
                label=queue.name, family=None, dlq=self.dlq_of(queue), sources=(queue,)
            )
        sources = tuple(self.sources_of(queue))
        if not sources:
            raise NoDeadLetterQueue(
                f"queue {queue.name} has no dead-letter exchange and no queue dead-letters "
                "into it: it has no DLQ and is no DLQ"
            )
        owner = next(
            (f for f in layout.families for s in sources if queue_name(f.queue) == s.name), None
        )
        if owner is None:
            # A family's DLQ by its expected name, though the family's queue is elsewhere.
            owner = next(
                (f for f in layout.families if f.dlq and queue_name(f.dlq) == queue.name), None
            )
        label = owner.name if owner is not None and len(sources) == 1 else queue.name
        return DlqTarget(label=label, family=owner, dlq=queue, sources=sources)


#: Which queues each ``apply-to`` takes (by the queue's type; 3.12 added the typed ones).
_APPLIES_TO: Final = {
    "all": None,
    "queues": None,
    "classic_queues": "classic",
    "quorum_queues": "quorum",
    "streams": "stream",
}


def _chosen(policies: list[dict[str, Any]], name: str, kind: str) -> Policy:
    """The policy RabbitMQ applies to queue ``name`` of type ``kind`` (``{}``: none);
    raises ``re.error`` for a pattern Python cannot read. A tie in priority RabbitMQ leaves
    unspecified: the first listed is taken."""
    best: dict[str, Any] | None = None
    for policy in policies:
        applies = str(policy.get("apply-to") or "all")
        if applies not in _APPLIES_TO or _APPLIES_TO[applies] not in (None, kind):
            continue
        if re.search(str(policy.get("pattern", "")), name) is None:
            continue
        if best is None or _priority(policy) > _priority(best):
            best = policy
    return dict(best) if best is not None else {}


def _definition(policy: Policy) -> dict[str, Any]:
    definition = policy.get("definition")
    return dict(definition) if isinstance(definition, dict) else {}


def _merged(regular: Policy, operator: Policy) -> dict[str, Any]:
    """The definition applied: the policy's, merged with the operator policy's (the lower
    of two numbers winning)."""
    merged = _definition(regular)
    for key, value in _definition(operator).items():
        mine = merged.get(key)
        both = _is_int(mine) and _is_int(value)
        merged[key] = min(mine, value) if both else value if mine is None else mine
    return merged


def _policy_limit(
    raw: Mapping[str, Any], chosen: tuple[Policy, Policy] | None
) -> DeliveryLimit | None:
    """The policies' delivery limit: the lower of the policy's and the operator policy's,
    and the statistic's too (a guard against reading toward a limit errs toward seeing
    one: a policy removed a moment ago refuses a few seconds more); a positive one before
    a negative (4.x's unlimited) for the same reason."""
    found: list[DeliveryLimit] = []
    for policy, kind in zip(chosen or (), ("policy", "operator policy"), strict=False):
        value = _definition(policy).get("delivery-limit")
        if _is_int(value):
            found.append(DeliveryLimit(value, f" from {kind} {policy.get('name')}"))
    statistic = _statistic(raw).get("delivery-limit")
    if _is_int(statistic):
        named = raw.get("operator_policy") or raw.get("policy")
        found.append(
            DeliveryLimit(statistic, f" from policy {named}" if named else " from its policy")
        )
    positive = [limit for limit in found if limit.value > 0]
    return min(positive or found, key=lambda limit: limit.value, default=None)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _priority(policy: Mapping[str, Any]) -> int:
    value = policy.get("priority", 0)
    return value if isinstance(value, int) else 0


def _statistic(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The queue's ``effective_policy_definition`` as the management API's statistics hold
    it (lagging; see the module's docstring)."""
    policy = raw.get("effective_policy_definition") or {}
    return dict(policy) if isinstance(policy, dict) else {}


def _routes(kind: str, binding_key: str, routing_key: str) -> bool:
    """Whether an exchange of ``kind`` routes ``routing_key`` along a binding."""
    if kind == "fanout":
        return True
    if kind == "topic":
        return _topic(binding_key).fullmatch(routing_key) is not None
    if kind == "headers":
        return True  # headers exchanges route by the message's headers: every bound queue may
    return binding_key == routing_key


def _topic(pattern: str) -> re.Pattern[str]:
    parts = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:[^.]*(?:\.[^.]*)*)?")
        elif word == "*":
            parts.append(r"[^.]*")
        else:
            parts.append(re.escape(word))
    # "#" also matches zero words, so the dot beside it is optional.
    text = r"\.".join(parts).replace(r"\.(?:[^.]*(?:\.[^.]*)*)?", r"(?:\.[^.]*)*")
    return re.compile(text.replace(r"(?:[^.]*(?:\.[^.]*)*)?\.", r"(?:[^.]*\.)*"))
