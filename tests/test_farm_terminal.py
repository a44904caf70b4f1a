"""The farm at a terminal, against a live farm over /v1: `./farm render`, `watch`, `runs`,
`takes get`, `models ls` — their output, their files and their exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.conftest import delay_graph, png, smoke_stack_reported, upload

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent


def farm_cli(farm: Any, token: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inline_farm.cli", *args, "--url", farm.url, "--token", token],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"},
    )


@pytest.fixture
def stack(farm, personas, data_dirs):
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def test_render_makes_n_runs_shows_their_progress_and_downloads_each_take(
        farm, personas, stack, tmp_path, owner):
    out = farm_cli(farm, personas["owner"], "render", "a lighthouse at dusk", "-n", "3",
                   "--size", "64x48", "--steps", "3", "--seed", "40", "-o", str(tmp_path),
                   "--model", stack["model"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    run_ids, files = lines[:3], [Path(p) for p in lines[3:]]
    for run_id in run_ids:
        assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "succeeded"
    assert sorted(f.name for f in files) == sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 3
    assert {f.name.split("-")[1] for f in files} == {"seed40", "seed41", "seed42"}
    assert {f.name[:8] for f in files} == {r[:8] for r in run_ids}
    for f in files:
        assert Image.open(f).size == (64, 48)
    assert "3/3" in out.stderr  # each run's bar reached its last step


def test_render_exits_non_zero_naming_what_is_wrong(farm, personas, stack, tmp_path):
    unknown = farm_cli(farm, personas["owner"], "render", "x", "--model", "nope.safetensors",
                       "-o", str(tmp_path))
    assert unknown.returncode == 1 and "nope.safetensors" in unknown.stderr
    nothing = farm_cli(farm, personas["owner"], "render", "-o", str(tmp_path))
    assert nothing.returncode == 1 and "say what to render" in nothing.stderr
    bad_token = farm_cli(farm, "not-a-token", "runs")
    assert bad_token.returncode == 1 and "Bearer" in bad_token.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_a_render_cancels_its_run(farm, personas, owner, tmp_path):
    asset = upload(owner, png(16, 16, (4, 5, 6))).json()["id"]
    graph = tmp_path / "slow.json"
    graph.write_text(json.dumps(delay_graph(asset, 30)))
    render = subprocess.Popen(
        [sys.executable, "-m", "inline_farm.cli", "render", "--graph", str(graph), "-o",
         str(tmp_path / "out"), "--url", farm.url, "--token", personas["owner"]],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        # Ctrl-C at a terminal: a suite started in the background (`cmd &` in a script) hands its
        # children SIGINT ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert render.stdout is not None
    run_id = render.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while owner.get(f"/v1/runs/{run_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.1)
    render.send_signal(signal.SIGINT)
    assert _exit_code(render, 30) == 130, render.stderr.read() if render.stderr else ""
    assert owner.wait_run(run_id)["status"] == "cancelled"


def test_watch_runs_and_takes_get_read_a_finished_render(farm, personas, stack, tmp_path, owner):
    rendered = farm_cli(farm, personas["owner"], "render", "a red door", "--size", "32x32",
                        "--steps", "2", "--seed", "7", "-o", str(tmp_path / "first"),
                        "--model", stack["model"])
    assert rendered.returncode == 0, rendered.stderr
    run_id = rendered.stdout.split()[0]

    watched = farm_cli(farm, personas["owner"], "watch", run_id, "-o", str(tmp_path / "again"))
    assert watched.returncode == 0, watched.stderr
    assert [p.name for p in (tmp_path / "again").iterdir()] == [
        p.name for p in (tmp_path / "first").iterdir()]

    table = farm_cli(farm, personas["owner"], "runs", "--status", "succeeded")
    assert table.returncode == 0 and run_id in table.stdout

    got = farm_cli(farm, personas["owner"], "takes", "get", run_id, "-o", str(tmp_path / "got"))
    assert got.returncode == 0, got.stderr
    take = owner.get(f"/v1/runs/{run_id}").json()["takes"][0]
    (path,) = (tmp_path / "got").iterdir()
    assert path.read_bytes() == owner.get(f"/v1/takes/{take['id']}/bytes").content
    by_take = farm_cli(farm, personas["owner"], "takes", "get", take["id"], "-o",
                       str(tmp_path / "one"))
    assert by_take.returncode == 0 and len(list((tmp_path / "one").iterdir())) == 1

    stranger = farm_cli(farm, personas["outsider"], "takes", "get", run_id, "-o", str(tmp_path))
    assert stranger.returncode == 1 and "no take" in stranger.stderr


def test_models_ls_lists_the_files_workers_hold(farm, personas, stack):
    listed = farm_cli(farm, personas["owner"], "models", "ls")
    assert listed.returncode == 0, listed.stderr
    for name in stack.values():
        assert name in listed.stdout


def test_render_picks_the_files_of_the_model_s_own_family(
        farm, personas, stack, data_dirs, tmp_path, owner):
    """With Z-Image's, FLUX.1's and SDXL's stacks side by side, `--model` a FLUX transformer
    renders with FLUX's VAE and both its text encoders (CLIP-L and T5), the Z-Image model with
    its own encoder, and the SDXL checkpoint alone (load/checkpoint): never a graph that mixes
    families."""
    from workers.models.flux1.tiny import write_smoke_stack
    from workers.models.sdxl.tiny import write_smoke_stack as write_sdxl

    names = write_smoke_stack(data_dirs["models"])
    checkpoint = write_sdxl(data_dirs["models"])["checkpoint"]
    deadline = time.monotonic() + 30
    while not {*names.values(), checkpoint} <= {f["name"] for f in owner.get(
            "/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the FLUX.1 and SDXL smoke stacks"
        time.sleep(0.2)
    for model in (names["model"], stack["model"], checkpoint):
        out = farm_cli(farm, personas["owner"], "render", "a red door", "--size", "32x32",
                       "--steps", "2", "--seed", "5", "-o", str(tmp_path / model), "--model", model)
        assert out.returncode == 0, out.stderr
        run = owner.get(f"/v1/runs/{out.stdout.split()[0]}").json()
        assert run["status"] == "succeeded", run
    assert list(run["takes"][0]["models"]) == [f"checkpoints/{checkpoint}"]  # the one loader


def _exit_code(process: subprocess.Popen[str], timeout: float) -> int:
    """The process's exit code; past `timeout`, fail with every thread's stack (the CLI dumps
    them on SIGUSR1) so that a hang says where it hangs."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        process.kill()
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"still running {timeout:.0f} s after Ctrl-C:\n{err}") from None


def test_render_with_loras_chains_load_lora_nodes_and_the_take_names_them(
        farm, personas, stack, data_dirs, tmp_path, owner):
    """`--lora FILE[:STRENGTH[:CLIP]]` (repeatable) puts a chain of load/lora nodes between the
    loaders and the sampler: the take's lineage names each LoRA's content and strengths, and
    the LoRAs change the image of the same seed."""
    from workers.models.catalog import file_sha256
    from workers.models.zimage.tiny import write_tiny_lora

    loras = [write_tiny_lora(data_dirs["models"], f"cli-style-{i}.safetensors", seed=40 + i)
             for i in range(2)]
    deadline = time.monotonic() + 30
    while not set(loras) <= {f["name"] for f in owner.get("/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the LoRA files"
        time.sleep(0.2)

    def render(*extra: str) -> dict[str, Any]:
        out_dir = tmp_path / str(len(extra))
        out = farm_cli(farm, personas["owner"], "render", "a red door", "--size", "32x32",
                       "--steps", "2", "--seed", "5", "-o", str(out_dir), "--model",
                       stack["model"], *extra)
        assert out.returncode == 0, out.stderr
        run = owner.get(f"/v1/runs/{out.stdout.split()[0]}").json()
        assert run["status"] == "succeeded", run
        return {"take": run["takes"][0], "pixels": Image.open(out.stdout.split()[1]).tobytes()}

    plain = render()
    with_loras = render("--lora", f"{loras[0]}:0.8", "--lora", f"{loras[1]}:0.5:0")
    sha = [file_sha256(data_dirs["models"] / "loras" / name) for name in loras]
    assert with_loras["take"]["loras"] == {
        f"loras/{loras[0]}": {"sha256": sha[0], "strength": 0.8},
        f"loras/{loras[1]}": {"sha256": sha[1], "strength": 0.5}}
    assert "loras" not in plain["take"]
    assert with_loras["pixels"] != plain["pixels"]

    # SDXL's smoke LoRA has both halves: the checkpoint's encoder goes through the chain too
    from workers.models.sdxl.plugin import write_tiny_stack

    sdxl = write_tiny_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    while not {sdxl["checkpoint"], sdxl["lora"]} <= {
            f["name"] for f in owner.get("/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the SDXL smoke stack"
        time.sleep(0.2)
    out = farm_cli(farm, personas["owner"], "render", "a red door", "--size", "32x32", "--steps",
                   "2", "--seed", "5", "-o", str(tmp_path / "sdxl"), "--model",
                   sdxl["checkpoint"], "--lora", f"{sdxl['lora']}:0.7:0.4")
    assert out.returncode == 0, out.stderr
    take = owner.get(f"/v1/runs/{out.stdout.split()[0]}").json()["takes"][0]
    lora_sha = file_sha256(data_dirs["models"] / "loras" / sdxl["lora"])
    assert take["loras"] == {f"loras/{sdxl['lora']}": {"sha256": lora_sha, "strength": 0.7}}
    assert take["textEncoderLoras"] == {f"loras/{sdxl['lora']}": {"sha256": lora_sha,
                                                                  "strength": 0.4}}

    refused = farm_cli(farm, personas["owner"], "render", "--graph", str(tmp_path / "g.json"),
                       "--lora", loras[0], "-o", str(tmp_path / "refused"))
    assert refused.returncode == 1 and "--lora adds LoRAs to a prompt's graph" in refused.stderr
