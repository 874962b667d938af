"""Read-only views: inspect's groups with what the Celery app says of their tasks (the scan
and its groups are :mod:`redrive.inspection`'s), the report over every family, status counts,
the layout check, alerts, and the audit trail of executed runs."""
