"""Every torch computation of a worker's runs happens on its one device thread.

torch's CPU kernels keep a thread team per calling thread; once a second thread has run a
parallel region, every region of the process runs as if single-threaded (workers/device/thread.py
has the figures). So runs on several slot threads must leave exactly one team behind: the device
thread's. Counted in a fresh process (this one has run torch on its own threads), with two
OpenMP threads per team, so each team adds one helper thread the OS can see (the tokenizer's own
thread pool is switched off so that it does not count).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

from workers.device.policy import DevicePolicy
from workers.runners import diffusion  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeContext

models_dir, names = Path(sys.argv[1]), json.loads(sys.argv[2])


def native_threads():
    # OS threads Python did not start: torch's helper threads (and nothing else here).
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def turbo(seed, image=None):
    ctx = NodeContext(run_id=f"run-{seed}", node_id="gen", node_type="zimage/turbo",
                      graph_sha256="0" * 64, models_dir=models_dir, owner_id=1,
                      policy=DevicePolicy(profile="cpu"), check_cancelled=lambda: None,
                      report_progress=lambda *a: None)
    params = {"prompt": "a red fox", "negative_prompt": "blurry", "width": 64, "height": 48,
              "steps": 3, "guidance": 2.0, "seed": seed, "strength": 0.6,
              "model": names["model"], "vae": names["vae"],
              "text_encoder": names["text_encoder"]}
    return RUNNERS["zimage/turbo"](ctx, params, {} if image is None else {"image": image})


import torch  # noqa: E402
# scipy (torchsde's dependency; diffusers' schedulers import scipy.stats when it is there) starts
# its OpenBLAS helper threads at import: not a torch team, so counted before, not after.
import scipy.stats  # noqa: E402,F401

before = native_threads()
picture = Image.new("RGB", (64, 48), (200, 120, 40))
with ThreadPoolExecutor(3, thread_name_prefix="slot") as slots:
    images = [f.result()["image"] for f in
              [slots.submit(turbo, 1), slots.submit(turbo, 2), slots.submit(turbo, 3, picture)]]
# The slots' threads were joined, but an OS thread may outlive its join by a moment (it still
# shows in /proc while Python no longer counts it): wait until the count stops changing.
import time  # noqa: E402

after, deadline = native_threads(), time.monotonic() + 5
while time.monotonic() < deadline:
    time.sleep(0.1)
    now = native_threads()
    if now == after:
        break
    after = now
print(json.dumps({"torch_threads": torch.get_num_threads(), "before": before,
                  "after": after, "sizes": [list(i.size) for i in images]}))
"""


def test_runs_on_several_slots_leave_one_torch_thread_team(smoke_stack):
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(smoke_stack.models_dir), json.dumps(smoke_stack.names)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["torch_threads"] == 2
    assert report["sizes"] == [[64, 48]] * 3
    # One team (the device thread's) of two threads: one helper. A slot that ran torch itself
    # would add its own.
    assert report["after"] - report["before"] == 1, report
