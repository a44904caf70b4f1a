"""The ASGI app: Django over HTTP, Channels for the websocket routes (/v1/runs/{id}/events).

HTTP goes through Django's own handlers, each where it is best (bench/ab.py, interleaved with
the sync door this replaced; the figures are in README "Benchmarks"):
- a response that streams a file (a take's or an upload's bytes: STREAMING_PATHS) goes
  through Django's ASGI handler, which sends each chunk as it is read and cancels the response
  when the client goes away; so does a request body of no declared length (chunked), which
  that handler spools whole before the middleware sees it (the size limits then count it;
  WSGI has no length to read such a body by);
- every other request goes through Django's WSGI handler on a thread pool: the whole
  middleware chain and the view in one thread hop, where the ASGI handler hops between the loop
  and a new thread per request five times (its web CPU per request was 1.5–2.5× the WSGI
  handler's for the same view and middleware). The adapter is inline_farm/onehop.py: a2wsgi's,
  but for a whole body in and one chunk out, which go in a single hop (a measured survivor).
Plain `GET /v1/health` is answered before either (inline_farm/health_door.py).
"""

from __future__ import annotations

import os
import re
import sys
from importlib import import_module
from typing import Any

from django.core.asgi import get_asgi_application

# The event loop (health, websockets, reading requests) shares the GIL with the threads running
# the sync views; at Python's default 5 ms switch interval a busy view thread held the loop off
# for tens of ms at a time under a submit flood. 1 ms keeps the loop's tail short.
sys.setswitchinterval(0.001)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")
django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

from inline_farm.health_door import health_first  # noqa: E402
from inline_farm.heap import freeze_long_lived  # noqa: E402
from inline_farm.onehop import OneHopWSGI  # noqa: E402
from inline_farm.routing import websocket_urlpatterns  # noqa: E402

# GETs whose answer streams a blob from disk (apps/takes/serve.py): takes' and uploads' bytes
# in /v1, the ComfyUI door's /view, the admin's previews.
STREAMING_PATHS = re.compile(
    r"/v1/takes/[^/]+/bytes/?"
    r"|/comfy/(?:k/[^/]+/)?(?:api/)?view/?"
    r"|/admin/takes/(?:take|asset)/[^/]+/bytes/"
)


def by_handler(streaming: Any, plain: Any) -> Any:
    """HTTP to `streaming` (Django's ASGI handler) for STREAMING_PATHS and chunked bodies, else
    to `plain`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunked = any(name == b"transfer-encoding" for name, _ in scope.get("headers") or ())
        chosen = (streaming if chunked or STREAMING_PATHS.fullmatch(scope.get("path", ""))
                  else plain)
        await chosen(scope, receive, send)

    return app


application = ProtocolTypeRouter({
    # The admin's CSS/JS come from the installed apps (no collectstatic, no extra server).
    "http": health_first(by_handler(
        django_asgi,
        # One pool thread per database connection the process may hold. (django-stubs type
        # the wrapped app as Django's own ASGIHandler and a WSGI handler's answer as a response
        # rather than the iterable of bytes it is; any ASGI app / WSGI app works at run time.)
        ASGIStaticFilesHandler(OneHopWSGI(  # type: ignore[arg-type]
            get_wsgi_application(),  # type: ignore[arg-type]
            workers=settings.INLINE_DB_POOL_SIZE)),
    )),
    "websocket": URLRouter(websocket_urlpatterns),
})

# Load the URLconf (every view, the /v1 API and its schemas) now rather than on the first request,
# then keep all of it out of the collector's full passes (inline_farm/heap.py).
import_module(settings.ROOT_URLCONF)
freeze_long_lived("web")
