"""Finding dead-letter queues and scanning them: which queue a target names, the scan that
holds what it receives, and the log of redrive's own receives."""
