from __future__ import annotations

from redrive.cli import main

if __name__ == "__main__":
    main()
