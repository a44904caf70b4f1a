"""The ASGI app: Django over HTTP, Channels for the websocket routes (/v1/runs/{id}/events)."""

from __future__ import annotations

import os
import sys
from importlib import import_module

from django.core.asgi import get_asgi_application

# The event loop (health, websockets, reading requests) shares the GIL with the thread running
# the sync views; at Python's default 5 ms switch interval a busy view thread held the loop off
# for tens of ms at a time under a submit flood. 1 ms keeps the loop's tail short.
sys.setswitchinterval(0.001)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")
django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402 — after Django setup
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from inline_farm.health_door import health_first  # noqa: E402
from inline_farm.heap import freeze_long_lived  # noqa: E402
from inline_farm.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # Serves the admin's CSS/JS from the installed apps (no collectstatic, no extra server);
    # plain `GET /v1/health` is answered before Django (inline_farm/health_door.py); the rest is
    # Django's own ASGI handler (streaming responses stream; a client that goes away cancels).
    "http": health_first(ASGIStaticFilesHandler(django_asgi)),
    "websocket": URLRouter(websocket_urlpatterns),
})

# Load the URLconf (every view, the /v1 API and its schemas) now rather than on the first request,
# then keep all of it out of the collector's full passes (inline_farm/heap.py).
import_module(settings.ROOT_URLCONF)
freeze_long_lived("web")
