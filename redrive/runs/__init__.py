"""What every run shares, below the operations and inspect that make runs: its life in the
ledger (:mod:`~redrive.runs.lifecycle`), what it tells whoever watches it
(:mod:`~redrive.runs.observer`), the ``--processes`` supervisor and what its processes share
(:mod:`~redrive.runs.processes`, :mod:`~redrive.runs.shared`), the live runs a shared scan
asks about (:mod:`~redrive.runs.live`) and the messages a result names
(:mod:`~redrive.runs.listed`)."""
