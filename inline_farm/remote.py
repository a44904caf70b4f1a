"""A client of a farm's `/v1`, for the terminal commands (`./farm render`, `watch`, `runs`, …).

It speaks only the public contract (HTTP + the events websocket), so it works the same against
the farm `./farm up` runs here and a remote one (`--url` / `--token`, or INLINE_URL /
INLINE_TOKEN). No Django: this module runs in the launcher's own process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

DEFAULT_URL = "http://127.0.0.1:8188"


class FarmError(Exception):
    """The farm answered with an error (its `{error: {code, message, nodeId?}}`), or could not be
    reached; the message says which, for a person to read."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Farm:
    """One farm's `/v1`, as one user (the token's)."""

    url: str
    token: str
    timeout: float = 30.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=self.timeout,
                                 headers={"Authorization": f"Bearer {self.token}"})

    def close(self) -> None:
        self.http.close()

    # --- requests ------------------------------------------------------------------------------

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """`method path` → its JSON body; FarmError on a refusal or an unreachable farm."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FarmError(f"cannot reach the farm at {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise _error_of(response)
        return response.json() if response.content else None

    def submit(self, body: dict[str, Any]) -> str:
        return str(self.call("POST", "/v1/runs", json=body)["runId"])

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/runs/{quote(run_id)}"))

    def cancel(self, run_id: str) -> None:
        try:
            self.call("DELETE", f"/v1/runs/{quote(run_id)}")
        except FarmError as exc:
            if exc.status != 409:  # it ended meanwhile: nothing to cancel
                raise

    def runs(self, *, status: str | None = None, limit: int = 50,
             mine: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {}),
                                  **({"mine": "true"} if mine else {})}
        return list(self.call("GET", "/v1/runs", params=params)["items"])

    def take(self, take_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/takes/{quote(take_id)}"))

    def upload(self, path: Path) -> str:
        with path.open("rb") as f:
            asset = self.call("POST", "/v1/assets", files={"file": (path.name, f)})
        return str(asset["id"])

    def descriptor(self, node_type: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/models/{node_type}"))

    def workers(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/workers")["items"])

    def download(self, take: dict[str, Any], path: Path) -> Path:
        """The take's bytes into `path` (streamed; written whole or not at all)."""
        partial = path.with_name(path.name + ".part")
        try:
            with self.http.stream("GET", f"/v1/takes/{take['id']}/bytes") as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error_of(response)
                with partial.open("wb") as f:
                    for chunk in response.iter_bytes(1 << 20):
                        f.write(chunk)
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise FarmError(f"downloading take {take['id']}: {exc}") from None
        partial.replace(path)
        return path

    # --- events --------------------------------------------------------------------------------

    def events(self, run_id: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """The run's events from the websocket, from `after` on, until its `run_done`; resumes
        with `?after=` when the socket drops."""
        ws_url = self.url.replace("http", "ws", 1) + f"/v1/runs/{quote(run_id)}/events"
        while True:
            try:
                with connect(f"{ws_url}?after={after}", open_timeout=self.timeout,
                             subprotocols=["inline-farm.v1", f"bearer.{self.token}"]) as ws:  # type: ignore[list-item]
                    for raw in ws:
                        event = json.loads(raw)
                        after = max(after, int(event.get("seq") or event.get("lastSeq") or 0))
                        yield event
                        if event["type"] == "run_done":  # a finished run's log replays to it
                            return
            except ConnectionClosed as closed:
                if closed.rcvd is not None and closed.rcvd.code in (4401, 4404):
                    raise FarmError(f"run {run_id}: {closed.rcvd.reason or closed.rcvd.code}",
                                    status=closed.rcvd.code) from None
                # 1011 or a dropped connection: resume from the last seq seen
            except (OSError, TimeoutError) as exc:
                raise FarmError(f"cannot follow run {run_id} at {self.url}: {exc}") from None


TERMINAL = ("succeeded", "failed", "cancelled")


def _error_of(response: httpx.Response) -> FarmError:
    try:
        error = response.json()["error"]
        message = error["message"] + (f" (node {error['nodeId']})" if error.get("nodeId") else "")
        return FarmError(message, status=response.status_code, code=error.get("code"))
    except (ValueError, KeyError, TypeError):
        return FarmError(f"HTTP {response.status_code}: {response.text[:200]}",
                         status=response.status_code)


def farm_from(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The farm's URL and token: the arguments, else INLINE_URL / INLINE_TOKEN, else the local
    farm's URL and no token (the caller asks the local farm for one)."""
    return (url or os.environ.get("INLINE_URL") or DEFAULT_URL,
            token or os.environ.get("INLINE_TOKEN") or None)
