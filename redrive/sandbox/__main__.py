"""``python -m redrive.sandbox``: the sandbox without the CLI (the test suite starts it so)."""

from __future__ import annotations

import sys

from redrive.sandbox import _main

if __name__ == "__main__":
    sys.exit(_main())
