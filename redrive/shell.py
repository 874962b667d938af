"""Words as a POSIX shell reads them: the one quoting for everything redrive echoes back as
options or commands (suggested ``--execute`` commands, headers, the audit trail, errors).

``shlex.quote`` alone turns ``task == 'apps.x'`` into ``'task == '"'"'apps.x'"'"''``: right,
but unreadable. A word with single quotes and nothing a shell expands inside double quotes
goes in double quotes instead (``"task == 'apps.x'"``); any other word is quoted as
``shlex.quote`` does (a backtick, which a shell runs inside double quotes, stays in single
quotes).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

__all__ = ["shell_join", "shell_quote"]

# What a shell still reads inside double quotes: expansions and escapes, and an interactive
# bash's history (a `!` before anything but `=`, a blank or the end: `!=` is left alone).
_LIVE_IN_DOUBLE_QUOTES = re.compile(r'["$`\\]|!(?![=\s]|$)')


def shell_quote(word: str, *, always: bool = False) -> str:
    """``word`` as one shell word that reads back as itself, as readably as it can be.
    ``always``: in quotes even where a shell needs none (an expression inside a sentence,
    ``--where 'kwargs.' is not ...``, shows where it ends)."""
    if "'" in word and not _LIVE_IN_DOUBLE_QUOTES.search(word):
        return f'"{word}"'
    quoted = shlex.quote(word)
    return f"'{word}'" if always and quoted == word else quoted


def shell_join(words: Iterable[str]) -> str:
    """A command line that a shell splits back into ``words``."""
    return " ".join(shell_quote(word) for word in words)
