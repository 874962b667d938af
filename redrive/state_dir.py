"""redrive's state directory (the ledger, the receive log, the alerts' last-seen state) and
how directories under it are created. Beneath both the ledger and the DLQ's receive log,
which share the directory without either importing the other."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def default_state_dir() -> Path:
    """``$REDRIVE_STATE_DIR``, else ``$XDG_STATE_HOME/redrive``, else
    ``~/.local/state/redrive``."""
    state_dir = os.environ.get("REDRIVE_STATE_DIR")
    if state_dir:
        return Path(state_dir).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "redrive"
    return Path.home() / ".local" / "state" / "redrive"


def make_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parents as 0700; existing ones are left alone
    (the ledger may live in a shared directory such as /tmp that is not ours to chmod)."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process won the race: fine
            path.mkdir(mode=0o700)
