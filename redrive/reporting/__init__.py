"""Read-only views: a DLQ grouped by task, the report over every family, status counts, the
layout check, alerts, and the audit trail of executed runs."""
