"""The console (``redrive web``, the ``redrive[web]`` extra): server-rendered pages and a JSON
API over the core the CLI uses, with every guarantee the CLI gives.

Extension points: :mod:`redrive.web.actions` (the actions' routes) and
:class:`redrive.web.scans.ScanSource` (where pages read scans). This package's own
``__init__`` imports nothing: ``redrive web passwd`` (redrive.web.users) works without the
extra, and the core never imports a web framework."""
