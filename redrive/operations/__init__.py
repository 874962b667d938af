"""The operations that change queues: move (and native moves), purge and archive, replay, and
the plan files that pin down what a reviewed operation acts on."""
