"""A take's bytes over HTTP: ETag, Range (206 / 416), HEAD, and large takes streamed in bounded
memory to several clients at once, one of them going away halfway.

`INLINE_BIG_TAKE_MB=500 ./farm test tests/api/test_take_bytes.py -s` measures the issue's
500 MB case (the suite uses a smaller take; the bound scales with it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any

import httpx
import psutil

from tests.api.conftest import assert_error
from tests.conftest import png, resize_graph, upload

BIG_MB = int(os.environ.get("INLINE_BIG_TAKE_MB", "96"))


def _take(owner: Any) -> dict[str, Any]:
    asset = upload(owner, png(40, 30, (1, 2, 3))).json()["id"]
    run = owner.wait_run(owner.post("/v1/runs", json=resize_graph(asset, 33, 17)).json()["runId"])
    assert run["status"] == "succeeded", run
    return run["takes"][0]


def test_a_takes_bytes_carry_etag_length_and_answer_byte_ranges(owner, anonymous, outsider):
    take = _take(owner)
    url = f"/v1/takes/{take['id']}/bytes"
    whole = owner.get(url)
    assert whole.status_code == 200 and whole.headers["content-type"] == "image/png"
    data, size = whole.content, len(whole.content)
    assert hashlib.sha256(data).hexdigest() == take["sha256"]
    assert whole.headers["etag"] == f'"{take["sha256"]}"'
    assert whole.headers["content-length"] == str(size)
    assert whole.headers["accept-ranges"] == "bytes"

    for header, (first, last) in (("bytes=0-9", (0, 9)), ("bytes=10-", (10, size - 1)),
                                  ("bytes=-7", (size - 7, size - 1)),
                                  (f"bytes=5-{size + 100}", (5, size - 1))):
        part = owner.get(url, headers={"Range": header})
        assert part.status_code == 206, header
        assert part.content == data[first:last + 1], header
        assert part.headers["content-range"] == f"bytes {first}-{last}/{size}", header
        assert part.headers["content-length"] == str(last + 1 - first), header

    for header in (f"bytes={size}-", "bytes=9-3"):
        refused = owner.get(url, headers={"Range": header})
        assert_error(refused, 416, "range_not_satisfiable")
        assert refused.headers["content-range"] == f"bytes */{size}"

    # Ranges this server does not cut (several, another unit) and an If-Range for other bytes
    # get the whole take, as HTTP allows.
    for headers in ({"Range": "bytes=0-1,4-5"}, {"Range": "items=0-1"},
                    {"Range": "bytes=0-1", "If-Range": '"another"'}):
        assert owner.get(url, headers=headers).content == data, headers
    assert owner.get(url, headers={"Range": "bytes=0-1", "If-Range": whole.headers["etag"]}
                     ).status_code == 206

    cached = owner.get(url, headers={"If-None-Match": whole.headers["etag"]})
    assert cached.status_code == 304 and cached.content == b""
    head = owner.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(size) and head.headers["etag"] == whole.headers["etag"]

    assert_error(outsider.get(url), 404, "not_found")
    assert_error(anonymous.get(url), 401, "unauthorized")


def _big_take(farm: Any, owner: Any, mb: int) -> tuple[str, str, int]:
    """A take of `mb` MiB (a video-sized blob) on one of the owner's runs: (id, sha256, size)."""
    from django.conf import settings

    from apps.runs.models import Run
    from apps.takes.models import Take
    from apps.takes.storage import blob_path

    small = _take(owner)
    run = Run.objects.get(pk=small["runId"])
    piece = os.urandom(1024 * 1024)
    digest = hashlib.sha256()
    staging = settings.INLINE_BLOB_DIR / f".big-{os.getpid()}"
    staging.parent.mkdir(parents=True, exist_ok=True)
    with open(staging, "wb") as f:
        for i in range(mb):
            chunk = piece[i % 997:] + piece[:i % 997]  # every MiB different
            digest.update(chunk)
            f.write(chunk)
    sha = digest.hexdigest()
    blob_path(sha).parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, blob_path(sha))
    take = Take.objects.create(run=run, owner=run.owner, node_id="film", sha256=sha,
                               media_type="video/mp4", size=mb * 1024 * 1024)
    return str(take.pk), sha, mb * 1024 * 1024


class _PeakRss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process, self.peak, self.done = psutil.Process(pid), 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.01)


def test_a_large_take_streams_to_four_clients_in_bounded_memory(farm, owner, personas, db_access):
    take_id, sha, size = _big_take(farm, owner, BIG_MB)
    url = f"{farm.url}/v1/takes/{take_id}/bytes"
    auth = {"Authorization": f"Bearer {personas['owner']}"}
    web = psutil.Process(farm.procs["web"].pid)
    before = web.memory_info().rss
    results: dict[str, Any] = {}

    def fetch(name: str, headers: dict[str, str], stop_after: int | None = None) -> None:
        digest, received = hashlib.sha256(), 0
        with httpx.Client(timeout=120) as client, client.stream(
                "GET", url, headers={**auth, **headers}) as response:
            results[f"{name}.status"] = response.status_code
            for chunk in response.iter_bytes(1024 * 1024):
                digest.update(chunk)
                received += len(chunk)
                if stop_after is not None and received >= stop_after:
                    break  # leaving the block closes the connection halfway
        results[name] = (received, digest.hexdigest())

    half = size // 2
    peak = _PeakRss(web.pid)
    peak.start()
    clients = [threading.Thread(target=fetch, args=("a", {})),
               threading.Thread(target=fetch, args=("b", {})),
               threading.Thread(target=fetch, args=("range", {"Range": f"bytes={half}-"})),
               threading.Thread(target=fetch, args=("gone", {}, half))]
    for t in clients:
        t.start()
    for t in clients:
        t.join(timeout=300)
    peak.done.set()
    peak.join()
    growth_mb = (peak.peak - before) / 2**20
    print(f"\n{BIG_MB} MiB take to 4 clients: web RSS {before / 2**20:.0f} MiB before, "
          f"peak {peak.peak / 2**20:.0f} MiB, growth {growth_mb:.1f} MiB")

    assert results["a"] == results["b"] == (size, sha)
    assert results["range.status"] == 206 and results["range"][0] == size - half
    assert half <= results["gone"][0] < size
    assert growth_mb < min(64, BIG_MB / 3), f"web RSS grew {growth_mb:.1f} MiB"
    # The web still answers once the client that left is gone.
    assert httpx.get(f"{farm.url}/v1/health").status_code == 200


def test_a_client_that_leaves_stops_the_reading(farm, owner, personas, db_access):
    """A video player seeking drops its requests mid-way: the web stops reading the file at
    once, rather than reading what nobody will receive to its end."""
    take_id, _, size = _big_take(farm, owner, BIG_MB)
    web = psutil.Process(farm.procs["web"].pid)
    before = web.io_counters().read_chars
    with httpx.Client(timeout=60) as client, client.stream(
            "GET", f"{farm.url}/v1/takes/{take_id}/bytes",
            headers={"Authorization": f"Bearer {personas['owner']}"}) as response:
        assert response.status_code == 200
        received = 0
        for chunk in response.iter_bytes(1024 * 1024):
            received += len(chunk)
            if received >= 4 * 2**20:
                break
    deadline = time.monotonic() + 10  # the web settles: its reads stop growing
    read = web.io_counters().read_chars - before
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = web.io_counters().read_chars - before
        if now == read:
            break
        read = now
    print(f"\nleft after 4 MiB of {size / 2**20:.0f} MiB: the web read {read / 2**20:.1f} MiB")
    assert read < size / 4, f"the web read {read / 2**20:.1f} MiB of a {size / 2**20:.0f} MiB take"
