"""MkDocs hook: links written for GitHub's view of the repository, made right for the site.

The pages link as the files lie in the repository, so that GitHub renders every link: a page
in docs/ links a runbook as ``../runbooks/X.md``, a runbook links a page as ``../docs/X.md``.
The site shows runbooks/ through the ``docs/runbooks`` link, one folder lower: rewritten
here, before MkDocs checks every link (``mkdocs build --strict`` fails on a broken one).
"""

from __future__ import annotations

import re
from typing import Any

_TO_RUNBOOKS = re.compile(r"\]\(\.\./runbooks/")
_TO_DOCS = re.compile(r"\]\(\.\./docs/")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri.startswith("runbooks/"):
        return _TO_DOCS.sub("](../", markdown)
    return _TO_RUNBOOKS.sub("](runbooks/", markdown)
