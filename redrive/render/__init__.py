"""Rendering results for people: tables (tabulate) and Markdown, one module per view, the
fitted tables they share in :mod:`redrive.render.tables`. JSON comes from ``to_json``."""
