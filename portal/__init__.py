"""Portal project: settings, URLs, ASGI entry, Celery app and shared API plumbing."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
