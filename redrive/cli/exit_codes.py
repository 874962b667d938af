"""The exit codes of every command (docs/exit-codes.md lists them)."""

from __future__ import annotations

EXIT_OK = 0


EXIT_ERROR = 1


EXIT_USAGE = 2


EXIT_ATTENTION = 3


EXIT_INTERRUPTED = 130
