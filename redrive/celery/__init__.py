"""Celery integrations (the ``celery`` extra): each module imports Celery only when used."""
