"""ComfyUI's API on the farm vs /v1: the same image-only work, submitted both ways, side by side.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/comfy.py [--runs 200] [--burst 200]

Graph: LoadImage → ImageScale (a new size every run, so no cache answers) → SaveImage, i.e.
image/load → image/resize → image/save, on a throwaway farm (web + one worker + beat, as
bench/hotpath.py). Each path is timed the way its own clients wait:

- /v1: `POST /v1/runs`, then polling `GET /v1/runs/{id}` until the run finished;
- /comfy: `POST /comfy/prompt` with a `client_id` whose `/ws` is open, then waiting on that
  socket for ComfyUI's end of the prompt (`executing` with `node: null`), as
  script_examples/websockets_api_example.py does.

Sequential: submit → done p50 / p90 and the HTTP submit alone. Burst: `--burst` prompts from 8
threads by 8 users (accepted/s, completed/s), for both paths. ComfyUI 0.3.64 on these 2 cores
(FACTS.md): 5.9 ms p50 submit → done, 167 prompts/s sequential, a burst completes 187/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._farm import bench_farm, each_user, per_second  # noqa: E402
from bench.hotpath import _graph, _p, _png, more_tokens, wait_done, wait_for_worker  # noqa: E402


def prompt_of(image: str, n: int) -> dict[str, Any]:
    w, h = 32 + n % 97, 32 + (n // 97) % 97
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image, "upload": "image"}},
        "2": {"class_type": "ImageScale", "inputs": {"upscale_method": "lanczos", "width": w,
                                                     "height": h, "crop": "disabled",
                                                     "image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "bench",
                                                    "images": ["2", 0]}},
    }


class Comfy:
    """One user's ComfyUI client: HTTP on the Bearer base URL and one open /ws."""

    def __init__(self, url: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=f"{url}/comfy", headers=headers, timeout=60)
        self.client_id = uuid.uuid4().hex
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(connect(
            f"{url.replace('http', 'ws', 1)}/comfy/ws?clientId={self.client_id}",
            additional_headers=headers, open_timeout=30))
        self.ws.recv(timeout=30)  # the first `status`

    def queue(self, prompt: dict[str, Any]) -> str:
        r = self.http.post("/prompt", json={"prompt": prompt, "client_id": self.client_id})
        assert r.status_code == 200, r.text
        return str(r.json()["prompt_id"])

    def wait_done(self, pending: set[str]) -> list[float]:
        """Read /ws until every prompt in `pending` ended; when each one did."""
        ends, failed = [], []
        while pending:
            out = self.ws.recv(timeout=120)
            if not isinstance(out, str):
                continue
            message = json.loads(out)
            data = message.get("data", {})
            if message["type"] == "execution_error":
                failed.append(data)
            if message["type"] == "executing" and data.get("node") is None \
                    and data.get("prompt_id") in pending:
                pending.discard(data["prompt_id"])
                ends.append(time.time())
        assert not failed, failed
        return ends

    def close(self) -> None:
        self.stack.close()
        self.http.close()


def upload(url: str, token: str, data: bytes) -> str:
    r = httpx.post(f"{url}/comfy/upload/image", headers={"Authorization": f"Bearer {token}"},
                   files={"image": ("b.png", data, "image/png")})
    return str(r.json()["name"])


def v1_sequential(client: httpx.Client, asset: str, runs: int, first: int) -> dict[str, list[float]]:
    total, submit = [], []
    for n in range(first, first + runs):
        t0 = time.time()
        r = client.post("/v1/runs", json=_graph(asset, n))
        submit.append(time.time() - t0)
        run, seen = wait_done(client, r.json()["runId"])
        assert run["status"] == "succeeded", run
        total.append(seen - t0)
    return {"total": total, "submit": submit}


def comfy_sequential(comfy: Comfy, image: str, runs: int, first: int) -> dict[str, list[float]]:
    total, submit = [], []
    for n in range(first, first + runs):
        t0 = time.time()
        pid = comfy.queue(prompt_of(image, n))
        submit.append(time.time() - t0)
        (end,) = comfy.wait_done({pid})
        total.append(end - t0)
    return {"total": total, "submit": submit}


def v1_burst(url: str, tokens: list[str], assets: dict[str, str], total: int) -> tuple[float, float]:
    from bench.hotpath import burst

    return burst(url, tokens, assets, total)


def comfy_burst(url: str, tokens: list[str], images: dict[str, str], total: int,
                first: int) -> tuple[float, float]:
    per_user = total // len(tokens)
    accepted: list[float] = []
    done: list[float] = []
    lock = threading.Lock()
    clients = {t: Comfy(url, t) for t in tokens}  # sockets open before the clock starts
    start = time.time()

    def user(token: str, k: int) -> None:
        comfy = clients[token]
        ids = set()
        for n in range(per_user):
            ids.add(comfy.queue(prompt_of(images[token], first + k * 1000 + n)))
            with lock:
                accepted.append(time.time())
        ends = comfy.wait_done(ids)
        with lock:
            done.extend(ends)

    each_user(tokens, user)
    for comfy in clients.values():
        comfy.close()
    return per_second(accepted, start), per_second(done, start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()
    data = _png()
    with bench_farm(beat=True) as (farm, token, _models):
        tokens = [token, *more_tokens(farm.env, 8)]
        wait_for_worker(farm.url)
        assets, images = {}, {}
        for t in tokens:
            assets[t] = httpx.post(f"{farm.url}/v1/assets", headers={
                "Authorization": f"Bearer {t}"}, files={"file": ("a.png", data, "image/png")}
            ).json()["id"]
            images[t] = upload(farm.url, t, data)
        comfy = Comfy(farm.url, tokens[0])
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {tokens[0]}"},
                              timeout=60)
        v1_sequential(client, assets[tokens[0]], 10, 0)  # warm up every process
        comfy_sequential(comfy, images[tokens[0]], 10, 100)
        # Distinct sizes per path and per phase: no run is coalesced or answered from a cache.
        v1 = v1_sequential(client, assets[tokens[0]], args.runs, 20_000)
        door = comfy_sequential(comfy, images[tokens[0]], args.runs, 40_000)
        v1_acc, v1_comp = v1_burst(farm.url, tokens, assets, args.burst)
        c_acc, c_comp = comfy_burst(farm.url, tokens, images, args.burst, 60_000)
        comfy.close()

    print(f"\n{args.runs} sequential runs, image-only (load → resize → save):")
    print(f"  {'':<34} {'/v1':>16} {'/comfy':>16}")
    for key, label in (("total", "submit → done p50"), ("submit", "HTTP submit p50")):
        print(f"  {label:<34} {_p(v1[key], .5):13.2f} ms {_p(door[key], .5):13.2f} ms")
    print(f"  {'submit → done p90':<34} {_p(v1['total'], .9):13.2f} ms "
          f"{_p(door['total'], .9):13.2f} ms")
    print(f"  {'sequential runs/s':<34} {len(v1['total']) / sum(v1['total']):16.0f} "
          f"{len(door['total']) / sum(door['total']):16.0f}")
    print(f"\nburst: {args.burst} runs from 8 threads by 8 users")
    print(f"  {'accepted/s':<34} {v1_acc:16.0f} {c_acc:16.0f}")
    print(f"  {'completed/s':<34} {v1_comp:16.0f} {c_comp:16.0f}")
    print("\n(ComfyUI 0.3.64 on these 2 cores, FACTS.md: 5.9 ms p50, 167/s sequential, "
          "187/s burst)")


if __name__ == "__main__":
    main()
