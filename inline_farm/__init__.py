"""Inline Farm: the Django project (settings, urls, asgi, celery app, the /v1 API root)."""

from inline_farm.celery import app as celery_app

__all__ = ["celery_app"]
