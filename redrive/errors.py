"""Every error the core raises derives from :class:`RedriveError`.

The CLI maps :class:`UsageProblem` to exit code 2 and every other one to exit code 1,
printing ``str(error)``: so each message is one line that says what is wrong and what to do.
"""

from __future__ import annotations


class RedriveError(Exception):
    """Base of every error redrive raises on purpose."""

    partial: object | None = None
    """What the run this error stopped partway had done by then (its result, counted so
    far), set by the run as the error passes through it: the CLI prints that summary
    before the error's line, as it does for an interrupted run."""


class UsageProblem(RedriveError):
    """The command line asks for something that cannot work (exit 2)."""


class NotRepairable(RedriveError):
    """A message that a repair cannot edit: not a Celery task, or one whose body is not JSON
    (pickle, yaml, msgpack: never decoded, let alone unpickled), or one the decoder cannot
    read. The message itself is left as it was."""


class ConfigError(RedriveError):
    """The config file (or an environment variable) is broken."""


class QueueNotFound(RedriveError):
    """A family, queue name or URL does not resolve to an existing queue."""


class NoDeadLetterQueue(RedriveError):
    """A source queue dead-letters nowhere, so it has no DLQ."""


class AwsError(RedriveError):
    """An AWS call failed in a way the user must fix (credentials, access, endpoint, throttling)."""


class LedgerError(RedriveError):
    """The idempotency ledger cannot be opened or written."""


class ArchiveError(RedriveError):
    """An archive cannot be written or read."""


class BrokerError(RedriveError):
    """A broker's call failed in a way the user must fix (a broker other than SQS: SQS's
    errors are :class:`AwsError`)."""


class HoldsTimedOut(BrokerError):
    """The broker closed the channel holding redrive's copies: one was held longer than it
    allows (RabbitMQ's ``consumer_timeout``). Every copy held on that channel is back in
    its queue; what was sent and not yet acknowledged is the ledger's to tell."""


class BrokerUnavailable(RedriveError):
    """No call to the broker can succeed (unreachable, credentials refused): operations
    over several queues stop at once on this instead of failing each queue."""


class AwsUnavailable(AwsError, BrokerUnavailable):
    """No call can succeed: no credentials or region, rejected credentials, endpoint down.

    Operations over several queues stop at once on this instead of failing each queue.
    """


class ForeignEndpoint(AwsUnavailable):
    """What answers at the endpoint is not the AWS service: a 2xx that is no answer of the
    call (a proxy's page, a server of another kind, JSON of another shape), or a gateway's
    own error page (502, 503, 504). Check --endpoint-url and any proxy in between."""


class SendInDoubt(AwsError):
    """A send whose request may or may not have reached SQS (timeout, dropped connection,
    server error). Retrying it could send a task twice, so it is never retried blindly."""


class NotSent(RedriveError):
    """A send that provably never reached the broker: no connection to it could be made,
    so no byte of the request left. None of its messages is in the queue: their claims are
    released (the next run sends them), never left in doubt."""


class SendNotConnected(AwsUnavailable, NotSent):
    """SQS could not be connected to for a send, after its retries (refused, unreachable,
    the connect timed out): the batch was not sent. A timeout or a dropped connection after
    the connection was made is :class:`SendInDoubt` instead."""


class PostFailed(RedriveError):
    """A report could not be posted to a webhook (refused, timed out, not a 2xx answer)."""


class CeleryAppError(ConfigError):
    """The Celery app named by ``--celery-app`` (or REDRIVE_CELERY_APP, or ``[celery] app``)
    cannot be loaded or used: Celery missing, module or attribute missing, the import raised."""


class ResultBackendError(RedriveError):
    """Celery's result backend cannot be opened or read (bad URL, unreachable, too slow)."""


class RabbitMQNodeError(RedriveError):
    """A private RabbitMQ node (the sandbox's, the tests') could not be started or used."""


class RabbitMQNotInstalled(RabbitMQNodeError):
    """Debian's rabbitmq-server, which a private node runs, is not installed."""
