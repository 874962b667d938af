"""MkDocs hook: the pages are written for GitHub's view of the repository, made right for the
site here, before MkDocs checks every link (``mkdocs build --strict`` fails on a broken one).

- Links: a page in docs/ links a runbook as ``../runbooks/X.md``, a runbook links a page as
  ``../docs/X.md``, as the files lie in the repository. The site shows runbooks/ through the
  ``docs/runbooks`` link, one folder lower.
- Table cells: GitHub needs ``\\|`` for a pipe inside a code span in a table; Python-Markdown
  keeps a code span's pipe in its cell by itself and would show the backslash.
"""

from __future__ import annotations

import re
from typing import Any

_TO_RUNBOOKS = re.compile(r"\]\(\.\./runbooks/")
_TO_DOCS = re.compile(r"\]\(\.\./docs/")
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _unescape_pipes(line: str) -> str:
    if not line.startswith("|"):
        return line
    return _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri.startswith("runbooks/"):
        markdown = _TO_DOCS.sub("](../", markdown)
    else:
        markdown = _TO_RUNBOOKS.sub("](runbooks/", markdown)
    return "\n".join(_unescape_pipes(line) for line in markdown.split("\n"))
