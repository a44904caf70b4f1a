"""`./farm`: run the whole farm on one machine, get a token, write the smoke models, run the tests.

    ./farm up [--listen H] [--port P] [--data-dir D] [--models-dir M] [--profile …] [--workers N]
    ./farm token USERNAME [--staff]       ./farm models smoke       ./farm test [pytest args…]
    ./farm migrate                        ./farm manage <manage.py args…>      ./farm lint
    ./farm import WORKFLOW.json [--run]   (a ComfyUI workflow → our graph, and a run)
    ./farm worker [--gpus all|0,1] [--pool NAME] [--slots N] [--queues Q,…] [--data-dir D]
    ./farm web [--listen H] [--port P] [--processes N] [--data-dir D]
    ./farm render "PROMPT" [-n N] [-o DIR] …   ./farm watch RUN…   ./farm runs [--status S]
    ./farm takes get RUN|TAKE [-o DIR]          ./farm models ls      ./farm check [--json]
    (those six: any farm, with --url and --token)

Services come from the environment (DATABASE_URL, BROKER_URL, CHANNEL_REDIS_URL) and, where
DATABASE_URL or BROKER_URL is unset, from embedded PostgreSQL / Redis under the data dir
(`inline_farm.embedded`). This module never imports Django settings: every Django process is a
child that reads the environment prepared here.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from inline_farm import embedded
from inline_farm.env import env_bool

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("auto", "gpu-max", "lowvram", "cpu")
BASE_QUEUES = ("cpu",)  # every local worker serves these; INLINE_WORKER_QUEUES adds more
HEALTH_TIMEOUT_S = 120.0
CHILD_STOP_TIMEOUT_S = 15.0  # a solo worker finishes its current node first; the reaper covers it


class _Stop(Exception):
    """Raised in the main thread by SIGINT / SIGTERM: unwind and stop everything started."""


# --- Paths and environment --------------------------------------------------------------------


def uvicorn_argv(host: str, port: int, *extra: str) -> list[str]:
    """The web's command line (HTTP and websockets), for `./farm up`, `./farm web`, the tests'
    live farm and the benches.

    Per-message deflate is off: the run events are JSON frames of a few hundred bytes, and
    deflating each one once per socket (a compressor per connection) was 15% of the web's CPU
    at 200 sockets (bench/events.py under py-spy) for little saved; previews are PNG already.
    Off, the bench's p99 went from ~690 to ~580 ms and the web's CPU down by a tenth.

    No access log unless INLINE_ACCESS_LOG=1: clients poll their runs every few milliseconds,
    so a line per request floods the terminal and the logs, and uvicorn builds each line's
    arguments (client address, quoted path) even when its logger drops them (bench/hotpath.py
    under py-spy); runs, their events and errors are logged by the farm itself.
    """
    access = [] if env_bool("INLINE_ACCESS_LOG", False) else ["--no-access-log"]
    return [sys.executable, "-m", "uvicorn", "inline_farm.asgi:application", "--host", host,
            "--port", str(port), "--lifespan", "off", "--ws-per-message-deflate", "false",
            *access, *extra]


def _data_dir(args: argparse.Namespace) -> Path:
    raw = args.data_dir or os.environ.get("INLINE_DATA_DIR") or REPO_ROOT / "data"
    return Path(raw).expanduser().resolve()


def _models_dir(args: argparse.Namespace) -> Path:
    raw = args.models_dir or os.environ.get("INLINE_MODELS_DIR") or REPO_ROOT / "models"
    return Path(raw).expanduser().resolve()


def _base_env(data_dir: Path, models_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="inline_farm.settings",
        INLINE_DATA_DIR=str(data_dir),
        INLINE_MODELS_DIR=str(models_dir),
        PYTHONUNBUFFERED="1",
    )
    return env


def _manage(*args: str) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "manage.py"), *args]


_deferred: list[str] = []  # stop signals that arrived inside _signals_deferred()
_deferring = False


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold a stop signal while a service starts and its stop is registered (no leak window).

    Deferred in Python rather than with sigprocmask: a blocked mask is inherited across exec, so
    the children started meanwhile would never see SIGTERM.
    """
    global _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _deferred:
        raise _Stop(_deferred.pop())


def _raise_stop(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if _deferring:
        _deferred.append(name)
        return
    raise _Stop(name)


def _say_stopping(signum: int, frame: Any) -> None:
    print("farm: already stopping, please wait…", file=sys.stderr, flush=True)


# --- The service lock: one `up` per data dir, and where a running `up` keeps its URLs ----------


@contextlib.contextmanager
def _up_lock(data_dir: Path) -> Iterator[IO[str]]:
    """Hold `<data-dir>/farm-up.lock` exclusively for the life of `up`; it records the URLs.

    One-shot commands hold it shared while they run on their own temporary PostgreSQL, so an `up`
    cannot adopt a server that is about to be stopped under it.
    """
    path = data_dir / "farm-up.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"farm: another ./farm command is using {data_dir}") from None
        try:
            yield handle
        finally:
            handle.truncate(0)


def _record_services(lock: IO[str], env: dict[str, str]) -> None:
    keys = ("DATABASE_URL", "BROKER_URL", "CHANNEL_REDIS_URL")
    lock.seek(0)
    lock.truncate(0)
    lock.write(json.dumps({k: env[k] for k in keys if k in env}))
    lock.flush()


def _running_up_services(data_dir: Path, stack: contextlib.ExitStack) -> dict[str, str]:
    """The URLs of the `./farm up` running on this data dir; with none, {} and hold the lock
    shared (released by `stack`) so that no `up` starts meanwhile."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = stack.enter_context((data_dir / "farm-up.lock").open("a+"))
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # held exclusively: `up` is running; read what it recorded
        handle.seek(0)
        with contextlib.suppress(ValueError):
            return dict(json.loads(handle.read() or "{}"))
    return {}


# --- Embedded services ------------------------------------------------------------------------


def _provide_database(
    env: dict[str, str], data_dir: Path, stack: contextlib.ExitStack, *, adopt: bool = False
) -> None:
    """Embedded PostgreSQL when DATABASE_URL is unset. `adopt`: stop it at the end even if it
    was already running (`up` holds the lock, so a running server is a crashed run's leftover)."""
    if env.get("DATABASE_URL"):
        return
    with _signals_deferred():
        url, handle = embedded.start_postgres(data_dir)
        state = "started" if handle.owned else "adopted" if adopt else "attached to"
        handle.owned = handle.owned or adopt
        stack.callback(embedded.stop_postgres, handle)
    env["DATABASE_URL"] = url
    print(f"farm: {state} embedded PostgreSQL in {handle.pgdata}", file=sys.stderr)


def _provide_broker(env: dict[str, str], data_dir: Path, stack: contextlib.ExitStack) -> None:
    """Embedded Redis when BROKER_URL is unset: Celery on db 0, the channel layer on db 1."""
    if env.get("BROKER_URL"):
        return
    with _signals_deferred():
        url, handle = embedded.start_redis(data_dir)
        stack.callback(embedded.stop_redis, handle)
    env["BROKER_URL"] = f"{url}/0"
    env.setdefault("CHANNEL_REDIS_URL", f"{url}/1")
    print(f"farm: started embedded Redis on {url} ({handle.directory})", file=sys.stderr)


def _attach_services(env: dict[str, str], data_dir: Path, stack: contextlib.ExitStack) -> None:
    """For one-shot commands: a running `up`'s services, else a temporary embedded PostgreSQL.

    Two one-shot commands at once on one data dir share a temporary server; the one that started
    it stops it when it ends, perhaps under the other. Run them one at a time (or under `up`).
    """
    for key, value in _running_up_services(data_dir, stack).items():
        env.setdefault(key, value)
    _provide_database(env, data_dir, stack)


def _migrate(env: dict[str, str], *, quiet: bool = False) -> None:
    result = subprocess.run(
        _manage("migrate", "--noinput"),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
        text=True,
    )
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout)
        raise SystemExit(f"farm: migrate failed (exit {result.returncode})")


# --- Children: web, workers, beat -------------------------------------------------------------


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    pump: threading.Thread = field(repr=False)
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = field(default=None, repr=False)  # its own, if not the farm's
    started: float = field(default_factory=time.monotonic)
    quick_deaths: int = 0  # consecutive deaths soon after a start (a crash loop)


_print_lock = threading.Lock()


def _pump(name: str, stream: IO[bytes]) -> None:
    """Copy a child's output to ours, each line prefixed with the child's name."""
    prefix = f"{name:<8}| ".encode()
    out = sys.stdout.buffer
    for line in iter(stream.readline, b""):
        with _print_lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


def _spawn(name: str, argv: Sequence[str], env: dict[str, str]) -> _Child:
    process = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        preexec_fn=embedded._die_with_parent,
    )
    assert process.stdout is not None
    pump = threading.Thread(target=_pump, args=(name, process.stdout), daemon=True)
    pump.start()
    return _Child(name=name, process=process, pump=pump, argv=list(argv), env=env)


def worker_queues(env: dict[str, str]) -> str:
    """`cpu` plus the comma-separated INLINE_WORKER_QUEUES (e.g. `gpu.24g`)."""
    extra = [q.strip() for q in env.get("INLINE_WORKER_QUEUES", "").split(",") if q.strip()]
    return ",".join(dict.fromkeys([*BASE_QUEUES, *extra]))


def _child_commands(
    args: argparse.Namespace, data_dir: Path, env: dict[str, str]
) -> list[tuple[str, list[str]]]:
    """(name, argv) of web, worker1..N, the control worker and beat.

    The control worker (threads, queue `control`) runs beat's reaper/dispatcher passes, so they
    never wait behind a long generation on a solo-pool GPU worker.
    """
    py = sys.executable
    web = uvicorn_argv(args.listen, args.port)
    celery = [py, "-m", "celery", "-A", "inline_farm"]
    commands = [("web", web)]
    for i in range(1, args.workers + 1):
        # the pool is settings.CELERY_WORKER_POOL's threads (workers/pool.py)
        worker = [*celery, "worker", f"--concurrency={args.slots}", "-n", f"worker{i}@%h"]
        commands.append((f"worker{i}", [*worker, "-Q", worker_queues(env), "-l", "INFO"]))
    control = [*celery, "worker", "--concurrency=2", "-n", "control@%h"]
    commands.append(("control", [*control, "-Q", "control", "-l", "INFO"]))
    # beat at WARNING: at INFO it logs a line every second (the reaper's pass)
    beat = [*celery, "beat", "-s", str(data_dir / "celerybeat-schedule"), "-l", "WARNING"]
    commands.append(("beat", beat))
    return commands


def _start_children(
    args: argparse.Namespace, data_dir: Path, env: dict[str, str], stack: contextlib.ExitStack
) -> list[_Child]:
    children: list[_Child] = []
    stack.callback(_stop_children, children)  # registered last, so it runs before the services
    for name, argv in _child_commands(args, data_dir, env):
        with _signals_deferred():
            children.append(_spawn(name, argv, env))
    return children


def _stop_children(children: list[_Child]) -> None:
    """SIGTERM every child's process group, wait, then SIGKILL what is left."""
    for child in children:
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"farm: {child.name} did not stop in time; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()
        child.pump.join(timeout=2)


def _first_dead(children: list[_Child]) -> _Child | None:
    return next((c for c in children if c.process.poll() is not None), None)


# --- up ---------------------------------------------------------------------------------------


def _local_host(listen: str) -> str:
    """Where to reach a server bound to `listen` from this machine."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(listen, listen)


def _url(host: str, port: int, path: str) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}{path}"


def _health_ok(url: str, *, need_worker: bool = True) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body = json.loads(response.read() or b"{}")
            workers_ok = not need_worker or (body.get("workers") or 0) > 0
            return bool(response.status == 200 and workers_ok)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait_healthy(url: str, children: list[_Child], *, need_worker: bool = True) -> None:
    """Poll `url` until it answers 200 and reports a live worker (one that heartbeated, so its
    model files are known to the farm: a client's first submit finds them); SystemExit if a
    child dies first or on timeout."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = _first_dead(children)
        if dead is not None:
            code = dead.process.returncode
            raise SystemExit(f"farm: {dead.name} exited with code {code} while starting; stopping")
        if _health_ok(url, need_worker=need_worker):
            return
        time.sleep(0.5)
    what = "report a live worker" if need_worker else "answer 200"
    raise SystemExit(f"farm: {url} did not {what} within {HEALTH_TIMEOUT_S:.0f} s; stopping")


def _banner(args: argparse.Namespace, data_dir: Path, models_dir: Path, env: dict[str, str]) -> str:
    host = _local_host(args.listen)
    token_hint = f"./farm token USERNAME [--staff] --data-dir {data_dir}"
    return "\n".join(
        [
            "",
            "Inline Farm is up.",
            f"  API     {_url(host, args.port, '/v1/')}",
            f"  Docs    {_url(host, args.port, '/v1/docs')}",
            f"  Admin   {_url(host, args.port, '/admin/')}",
            f"  Data    {data_dir}",
            f"  Models  {models_dir}",
            f"  Workers {args.workers} × {args.slots} slots on queues {worker_queues(env)}, "
            f"profile {args.profile}",
            f"  Token   {token_hint}",
            "  Ctrl-C stops everything.",
            "",
        ]
    )


def _check_port_free(listen: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((listen, port))
        except OSError as error:
            raise SystemExit(f"farm: cannot listen on {listen}:{port}: {error.strerror}") from None


def _profile(args: argparse.Namespace) -> str:
    if args.cpu:
        return "cpu"
    if args.lowvram:
        return "lowvram"
    return args.profile or os.environ.get("INLINE_PROFILE") or "auto"


RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
QUICK_DEATH_S = 30.0  # a child that dies sooner than this after its start is crash-looping
MAX_QUICK_DEATHS = len(RESTART_BACKOFF_S)


def _device_env(args: argparse.Namespace, data_dir: Path, models_dir: Path) -> dict[str, str]:
    """The children's environment with the device flags of `up` and `worker` (sets args.profile)."""
    args.profile = _profile(args)
    env = _base_env(data_dir, models_dir)
    env["INLINE_PROFILE"] = args.profile
    if args.vram_budget is not None:
        env["INLINE_VRAM_BUDGET_GB"] = str(args.vram_budget)
    if args.cpu_offload:
        env["INLINE_CPU_OFFLOAD"] = "1"
    return env


def _until_stopped(run: Callable[[], int]) -> int:
    """Run a long-lived command: SIGINT / SIGTERM unwind it (returns 0), a second signal while
    it stops only says to wait. Call inside the command's ExitStack, so its cleanup runs after
    this returns, with the signals already answered."""
    try:
        signal.signal(signal.SIGINT, _raise_stop)
        signal.signal(signal.SIGTERM, _raise_stop)
        return run()
    except _Stop as stop:
        print(f"farm: {stop}: stopping", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGINT, _say_stopping)
        signal.signal(signal.SIGTERM, _say_stopping)


def _supervise(children: list[_Child], env: dict[str, str]) -> int:
    """Block until a signal (raises _Stop). A child that dies is started again after a backoff
    (as the systemd units do), so one lost worker never stops the farm; a child that keeps dying
    right after its start (MAX_QUICK_DEATHS in a row) stops everything (returns 1)."""
    while True:
        for i, child in enumerate(children):
            code = child.process.poll()
            if code is None:
                continue
            lived = time.monotonic() - child.started
            quick = child.quick_deaths + 1 if lived < QUICK_DEATH_S else 0
            if quick >= MAX_QUICK_DEATHS:
                print(f"farm: {child.name} keeps exiting (code {code}, {quick} times within "
                      f"{QUICK_DEATH_S:.0f} s of starting); stopping everything", file=sys.stderr)
                return 1
            wait = RESTART_BACKOFF_S[min(quick, len(RESTART_BACKOFF_S) - 1)]
            print(f"farm: {child.name} exited with code {code}; restarting it in {wait:.0f} s",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
            child.pump.join(timeout=2)
            with _signals_deferred():
                children[i] = _spawn(child.name, child.argv, child.env or env)
            children[i].quick_deaths = quick
        time.sleep(0.5)


def cmd_up(args: argparse.Namespace) -> int:
    data_dir, models_dir = _data_dir(args), _models_dir(args)
    data_dir.mkdir(parents=True, exist_ok=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    env = _device_env(args, data_dir, models_dir)
    _check_port_free(args.listen, args.port)
    with _up_lock(data_dir) as lock, contextlib.ExitStack() as stack:

        def run() -> int:
            _provide_database(env, data_dir, stack, adopt=True)
            _provide_broker(env, data_dir, stack)
            _record_services(lock, env)
            _migrate(env)
            children = _start_children(args, data_dir, env, stack)
            _wait_healthy(_url(_local_host(args.listen), args.port, "/v1/health"), children)
            print(_banner(args, data_dir, models_dir, env), flush=True)
            return _supervise(children, env)

        return _until_stopped(run)


# --- worker and web: one side of a farm whose services run elsewhere ---------------------------

SERVICE_KEYS = ("DATABASE_URL", "BROKER_URL", "CHANNEL_REDIS_URL")


def _join_services(env: dict[str, str], data_dir: Path, command: str) -> None:
    """Fill what the environment lacks of SERVICE_KEYS from the `./farm up` running on
    `data_dir`; SystemExit while the database or the broker is unknown (never the settings'
    localhost defaults by accident)."""
    if not all(env.get(key) for key in SERVICE_KEYS):
        with contextlib.ExitStack() as probe:  # the shared lock only while we read
            for key, value in _running_up_services(data_dir, probe).items():
                env[key] = env.get(key) or value
    missing = [key for key in SERVICE_KEYS[:2] if not env.get(key)]
    if missing:
        raise SystemExit(f"farm {command}: set {' and '.join(missing)} to the farm's services, or "
                         f"pass the --data-dir of a running ./farm up (none runs on {data_dir})")


@dataclass(frozen=True)
class _WorkerSpec:
    """One worker process `./farm worker` runs: its log name, Celery node name, queues, env."""

    label: str
    node: str
    queues: list[str]
    env: dict[str, str]
    about: str


def _chosen_gpus(wanted: str, gpus: list[Any]) -> list[Any]:
    """`--gpus all` (every GPU, maybe none) or `0,1` (those NVML indices, each must exist)."""
    if wanted.strip() == "all":
        return gpus
    by_index = {gpu.index: gpu for gpu in gpus}
    try:
        indices = [int(part) for part in wanted.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"farm worker: --gpus takes all or indices like 0,1, got {wanted!r}") from None
    absent = [i for i in indices if i not in by_index]
    if absent:
        seen = ", ".join(f"{g.index}: {g.name}" for g in gpus) or "none"
        raise SystemExit(f"farm worker: no GPU {absent[0]} on this host (GPUs seen: {seen})")
    return [by_index[i] for i in indices]


def _worker_specs(args: argparse.Namespace, env: dict[str, str]) -> list[_WorkerSpec]:
    """One spec per chosen GPU (pinned with CUDA_VISIBLE_DEVICES, queues `gpu.<N>g,cpu`), or one
    `cpu` worker without a GPU (or with --cpu). `--queues` replaces the derived queues."""
    from apps.fleet.capability import gpu_queue_for_vram  # torch- and Django-free
    from workers.device.nvml import host_gpus

    gpus = _chosen_gpus(args.gpus, [] if args.profile == "cpu" else host_gpus(env))
    prefix = f"{args.name or args.pool}-" if (args.name or args.pool) else ""
    extra = [q.strip() for q in env.get("INLINE_WORKER_QUEUES", "").split(",") if q.strip()]
    override = [q.strip() for q in (args.queues or "").split(",") if q.strip()]
    if not gpus:
        queues = override or ["cpu", *extra]
        return [_WorkerSpec("cpu", f"{prefix}cpu@%h", list(dict.fromkeys(queues)), env, "cpu")]
    if env.get("INLINE_PARALLEL") and len(gpus) > 1:
        return [_group_spec(gpus, prefix, override, env)]
    specs = []
    for gpu in gpus:
        usable = min(gpu.total_gb, args.vram_budget) if args.vram_budget else gpu.total_gb
        own = gpu_queue_for_vram(usable)
        queues = override or [q for q in (own, "cpu", *extra) if q]
        child = dict(env)
        if gpu.simulated:
            child["INLINE_GPU_DESCRIPTION"] = json.dumps(
                {"name": gpu.name, "vram_gb": gpu.total_gb, "bf16": gpu.bf16, "nvlink": gpu.nvlink})
        else:  # NVML's order is the PCI bus order; CUDA's default order differs
            child.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu.index))
        about = f"{gpu.name}, {gpu.total_gb:.0f} GB" + (" (simulated)" if gpu.simulated else "")
        specs.append(_WorkerSpec(f"gpu{gpu.index}", f"{prefix}gpu{gpu.index}@%h",
                                 list(dict.fromkeys(queues)), child, about))
    return specs


def _group_spec(gpus: list[Any], prefix: str, override: list[str], env: dict[str, str]) -> Any:
    """INLINE_PARALLEL with several GPUs: one worker owning all of them as one xfuser group
    (workers/parallel/), serving `xfuser.<n>`."""
    n = len(gpus)
    child = dict(env)
    if any(gpu.simulated for gpu in gpus):
        child["INLINE_GPU_DESCRIPTION"] = json.dumps(
            [{"name": g.name, "vram_gb": g.total_gb, "bf16": g.bf16, "nvlink": g.nvlink} for g in gpus])
    else:
        child.update(CUDA_DEVICE_ORDER="PCI_BUS_ID",
                     CUDA_VISIBLE_DEVICES=",".join(str(g.index) for g in gpus))
    about = f"{n}× {gpus[0].name} as one group ({env['INLINE_PARALLEL']})"
    return _WorkerSpec(f"group{n}", f"{prefix}xfuser{n}@%h", override or [f"xfuser.{n}"], child,
                       about)


def cmd_worker(args: argparse.Namespace) -> int:
    """`./farm worker`: this host's workers (one per GPU) join the farm and are kept running."""
    data_dir, models_dir = _data_dir(args), _models_dir(args)
    models_dir.mkdir(parents=True, exist_ok=True)
    env = _device_env(args, data_dir, models_dir)
    if args.pool:
        env["INLINE_POOL"] = args.pool
    if args.parallel:
        env["INLINE_PARALLEL"] = args.parallel
    _join_services(env, data_dir, "worker")
    specs = _worker_specs(args, env)
    celery = [sys.executable, "-m", "celery", "-A", "inline_farm", "worker",
              f"--concurrency={args.slots}"]
    with contextlib.ExitStack() as stack:

        def run() -> int:
            children: list[_Child] = []
            stack.callback(_stop_children, children)
            for spec in specs:
                argv = [*celery, "-n", spec.node, "-Q", ",".join(spec.queues), "-l", "INFO"]
                with _signals_deferred():
                    children.append(_spawn(spec.label, argv, spec.env))
            pool = args.pool or "(named after its device)"
            lines = [f"  {s.node:<24} {s.about}; queues {','.join(s.queues)}" for s in specs]
            print("\n".join(["", f"farm: {len(specs)} worker(s) × {args.slots} slots, pool {pool}, "
                             f"data {data_dir}, models {models_dir}", *lines,
                             "  Ctrl-C stops them.", ""]), flush=True)
            return _supervise(children, env)

        return _until_stopped(run)


def cmd_web(args: argparse.Namespace) -> int:
    """`./farm web`: migrate, then only the ASGI server (HTTP + websockets), kept running."""
    data_dir, models_dir = _data_dir(args), _models_dir(args)
    env = _base_env(data_dir, models_dir)
    _check_port_free(args.listen, args.port)
    _join_services(env, data_dir, "web")
    web = uvicorn_argv(args.listen, args.port)
    if args.processes > 1:
        web += ["--workers", str(args.processes)]
    with contextlib.ExitStack() as stack:

        def run() -> int:
            _migrate(env)
            children: list[_Child] = []
            stack.callback(_stop_children, children)
            with _signals_deferred():
                children.append(_spawn("web", web, env))
            host = _local_host(args.listen)
            _wait_healthy(_url(host, args.port, "/v1/health"), children, need_worker=False)
            print(f"\nfarm: web is up at {_url(host, args.port, '/v1/')} ({args.processes} "
                  f"process(es), data {data_dir}). Ctrl-C stops it.\n", flush=True)
            return _supervise(children, env)

        return _until_stopped(run)



# --- One-shot commands ------------------------------------------------------------------------


def cmd_token(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    env = _base_env(data_dir, _models_dir(args))
    with contextlib.ExitStack() as stack:
        _attach_services(env, data_dir, stack)
        _migrate(env, quiet=True)
        command = _manage("farm_token", args.username, *(["--staff"] if args.staff else []))
        return subprocess.run(command, cwd=REPO_ROOT, env=env).returncode


def cmd_import(args: argparse.Namespace) -> int:
    """`./farm import FILE [--run] [--user U]`: a ComfyUI workflow → our graph (+ a run)."""
    data_dir = _data_dir(args)
    env = _base_env(data_dir, _models_dir(args))
    workflow = str(Path(args.file).expanduser().resolve())
    with contextlib.ExitStack() as stack:
        _attach_services(env, data_dir, stack)
        _migrate(env, quiet=True)
        command = _manage("farm_import", workflow, *(["--run"] if args.run else []),
                          *(["--user", args.user] if args.user else []))
        return subprocess.run(command, cwd=REPO_ROOT, env=env).returncode


def cmd_migrate(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    env = _base_env(data_dir, _models_dir(args))
    with contextlib.ExitStack() as stack:
        _attach_services(env, data_dir, stack)
        _migrate(env)
    return 0


def cmd_manage(argv: list[str]) -> int:
    """`./farm manage ARGS`: manage.py against the same services `up` uses (or embedded PG)."""
    args = argparse.Namespace(data_dir=None, models_dir=None)
    data_dir = _data_dir(args)
    env = _base_env(data_dir, _models_dir(args))
    with contextlib.ExitStack() as stack:
        _attach_services(env, data_dir, stack)
        return subprocess.run(_manage(*argv), cwd=REPO_ROOT, env=env).returncode


def cmd_models(args: argparse.Namespace) -> int:
    if args.action == "ls":
        return cmd_remote(args)
    models_dir = _models_dir(args)
    os.environ.update(_base_env(_data_dir(args), models_dir))
    from workers.models.families import REGISTERED, plugin  # torch: only this command needs it

    models_dir.mkdir(parents=True, exist_ok=True)
    print(f"farm: wrote the tiny smoke stack into {models_dir}:")
    for family in REGISTERED:  # every registered model family writes its own
        for role, name in plugin(family).write_tiny_stack(models_dir).items():
            print(f"  {family} {role}: {name}")
    from workers.models.upscale.tiny import write_tiny_upscaler

    print(f"  upscaler: {write_tiny_upscaler(models_dir).name}")
    return 0


def cmd_test(pytest_args: list[str]) -> int:
    """The whole suite; embedded PostgreSQL / Redis in a temp dir for what the env lacks, and
    Chromium for the browser tests from the system's package manager when it can."""
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")
    env["PYTHONUNBUFFERED"] = "1"
    missing = _provide_chromium(env) if _selects_browser_tests(pytest_args) else None
    if missing:
        print(f"farm: {missing}; the other tests run", file=sys.stderr)
        pytest_args = [*pytest_args, "--ignore=tests/browser"]
    scratch = Path(tempfile.mkdtemp(prefix="inline-farm-test-"))
    env.setdefault("INLINE_DATA_DIR", str(scratch / "data"))
    try:
        with contextlib.ExitStack() as stack:
            _provide_database(env, scratch, stack)
            _provide_broker(env, scratch, stack)
            code = _run_forwarding_signals([sys.executable, "-m", "pytest", *pytest_args], env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if missing:
        print(f"farm: FAILED: {missing}", file=sys.stderr)
        return code or 1
    return code


def _selects_browser_tests(pytest_args: list[str]) -> bool:
    """Whether these pytest arguments run tests/browser: no path given (the whole suite), or a
    path at, above or under it."""
    browser = REPO_ROOT / "tests" / "browser"
    paths = [Path(a.split("::")[0]).resolve() for a in pytest_args
             if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    return not paths or any(p.is_relative_to(browser) or browser.is_relative_to(p) for p in paths)


def _provide_chromium(env: dict[str, str]) -> str | None:
    """None when the browser tests have their Chromium (installing Debian's package when it is
    missing and this is root with apt-get); else the one line that says what to install."""
    path = Path(env.get("INLINE_TEST_CHROMIUM", "/usr/bin/chromium"))
    if path.exists():
        return None
    if shutil.which("apt-get") and os.geteuid() == 0:
        print("farm: installing chromium for the browser tests (apt-get)", file=sys.stderr)
        subprocess.run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                       "apt-get install -y -qq chromium", shell=True, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if path.exists():
            return None
    return (f"the browser tests (tests/browser) need Chromium at {path}: install Debian's "
            "`chromium` package, or set INLINE_TEST_CHROMIUM to a Chromium binary")


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run `command` in the foreground: a terminal Ctrl-C reaches it directly (we ignore ours,
    so pytest can finish its teardown), SIGTERM is forwarded."""
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env)
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())
    try:
        return process.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def cmd_lint(extra: list[str]) -> int:
    """ruff (lint), then mypy (types, with the django-stubs plugin); the first failure wins."""
    bin_dir = Path(sys.executable).parent
    for command in ([str(bin_dir / "ruff"), "check", ".", *extra], [str(bin_dir / "mypy"), "."]):
        code = subprocess.run(command, cwd=REPO_ROOT).returncode
        if code:
            return code
    return 0


# --- A farm over /v1 (inline_farm/terminal.py) -------------------------------------------------


def cmd_remote(args: argparse.Namespace) -> int:
    """render, watch, runs, takes get, models ls: over /v1, to the local farm or `--url`."""
    import faulthandler
    import signal

    from inline_farm import terminal
    from inline_farm.remote import Farm, FarmError, farm_from

    if hasattr(signal, "SIGUSR1"):  # `kill -USR1` prints every thread's stack (a hung client)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    url, token = farm_from(args.url, args.token)
    from inline_farm.golive import cmd_check

    command = {"render": terminal.cmd_render, "watch": terminal.cmd_watch,
               "runs": terminal.cmd_runs, "takes": terminal.cmd_takes_get,
               "models": terminal.cmd_models_ls, "check": cmd_check}[args.command]
    farm = Farm(url, token or _local_token(args, url))
    try:
        try:
            return command(args, farm)
        except FarmError as exc:
            if exc.status != 401 or token:
                raise
            farm = Farm(url, _local_token(args, url, fresh=True))  # the cached token was revoked
            return command(args, farm)
    except FarmError as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return 1
    finally:
        farm.close()


def _local_token(args: argparse.Namespace, url: str, *, fresh: bool = False) -> str:
    """A token of $USER on the farm `./farm up` runs for this data dir, made once and kept in
    <data-dir>/cli-token (mode 600); a remote farm needs --token or INLINE_TOKEN."""
    if urllib.parse.urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"farm: {url} is not this machine's farm: pass --token or set "
                         "INLINE_TOKEN")
    data_dir = _data_dir(args)
    cached = data_dir / "cli-token"
    if cached.is_file() and not fresh:
        return cached.read_text().strip()
    user = os.environ.get("USER") or "artist"
    env = _base_env(data_dir, _models_dir(args))
    with contextlib.ExitStack() as stack:
        _attach_services(env, data_dir, stack)
        out = subprocess.run(_manage("farm_token", user, "--name", "terminal"), cwd=REPO_ROOT,
                             env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"farm: could not make a token for {user}: {out.stderr.strip()[-300:]}")
    secret = out.stdout.strip().splitlines()[-1]
    data_dir.mkdir(parents=True, exist_ok=True)
    cached.touch(mode=0o600)
    cached.write_text(secret)
    return secret


# --- Argument parsing -------------------------------------------------------------------------


def _add_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="runtime data (default: $INLINE_DATA_DIR or ./data)")
    parser.add_argument(
        "--models-dir", help="ComfyUI-style models tree (default: $INLINE_MODELS_DIR or ./models)"
    )


def _port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return port


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return number


def _size(value: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in value.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value} is not WIDTHxHEIGHT (e.g. 1024x768)") from None
    return width, height


def _lora(value: str) -> tuple[str, float, float]:
    """FILE[:STRENGTH[:STRENGTH_CLIP]] → (file, strength, strength_clip); the strengths default
    to 1 and to STRENGTH (ComfyUI's LoraLoader with both at one value)."""
    parts = value.split(":")
    numbers: list[float] = []
    while len(parts) > 1 and len(numbers) < 2:
        try:
            numbers.insert(0, float(parts[-1]))
        except ValueError:
            break
        parts.pop()
    name = ":".join(parts)
    if not name:
        raise argparse.ArgumentTypeError(f"{value!r} names no LoRA file (FILE[:STRENGTH])")
    strength = numbers[0] if numbers else 1.0
    return name, strength, numbers[1] if len(numbers) > 1 else strength


def _add_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the farm (default: $INLINE_URL or http://127.0.0.1:8188)")
    parser.add_argument("--token", help="an API token (default: $INLINE_TOKEN; for this "
                        "machine's farm, one made for $USER)")
    _add_dirs(parser)


def _add_render(commands: Any) -> None:
    render = commands.add_parser("render", help="render a prompt (or a graph / ComfyUI "
                                 "workflow) with live progress; download the takes")
    render.add_argument("prompt", nargs="?", default="", help="what to render")
    render.add_argument("--negative", default="", help="a negative prompt")
    render.add_argument("--model", help="the diffusion model file (default: the first held)")
    render.add_argument("--size", type=_size, default=(1024, 1024), help="WxH (default 1024x1024)")
    render.add_argument("--steps", type=_positive, default=8, help="denoising steps (default 8)")
    render.add_argument("--seed", type=int, help="the first run's seed (default: random); run "
                        "k of -n gets seed+k")
    render.add_argument("--guidance", type=float, help="CFG scale (default: the node's)")
    render.add_argument("--image", help="img2img: an input image file")
    render.add_argument("--strength", type=float, default=0.6,
                        help="img2img: how much of the image is re-noised (default 0.6)")
    source = render.add_mutually_exclusive_group()
    source.add_argument("--graph", help="submit this graph JSON ({graph, target}) instead")
    source.add_argument("--workflow", help="import and submit this ComfyUI workflow instead")
    render.add_argument("--lora", action="append", type=_lora, default=[],
                        metavar="FILE[:STRENGTH[:CLIP]]",
                        help="apply loras/FILE at STRENGTH (default 1) to the model and at CLIP "
                        "(default STRENGTH) to the text encoder; repeat to stack LoRAs")
    render.add_argument("-n", "--count", type=_positive, default=1, help="runs (default 1)")
    render.add_argument("-o", "--output", default=".", help="where takes go (default: here)")
    _add_remote(render)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="farm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run web + workers + beat (embedded services if unset)")
    up.add_argument("--listen", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    up.add_argument("--port", type=_port, default=8188, help="HTTP port (default 8188)")
    up.add_argument("--profile", choices=PROFILES, help="device profile (default: auto)")
    up.add_argument("--lowvram", action="store_true", help="shorthand for --profile lowvram")
    up.add_argument("--cpu", action="store_true", help="shorthand for --profile cpu")
    up.add_argument("--vram-budget", type=float, metavar="GB",
                    help="cap the VRAM the device policy counts (INLINE_VRAM_BUDGET_GB)")
    up.add_argument("--cpu-offload", action="store_true",
                    help="keep the text encoder and VAE in CPU memory between uses")
    up.add_argument("--workers", type=_positive, default=1, help="Celery workers (default 1)")
    up.add_argument("--slots", type=_positive,
                    default=int(os.environ.get("INLINE_WORKER_SLOTS") or 4),
                    help="runs each worker executes at once (default: $INLINE_WORKER_SLOTS or 4)")
    _add_dirs(up)

    token = commands.add_parser("token", help="create USERNAME if needed, print a fresh token")
    token.add_argument("username")
    token.add_argument("--staff", action="store_true", help="make a new user staff")
    _add_dirs(token)

    importer = commands.add_parser("import", help="import a ComfyUI workflow (UI or API JSON)")
    importer.add_argument("file", help="the workflow JSON file")
    importer.add_argument("--run", action="store_true", help="also submit it as a run")
    importer.add_argument("--user", help="the run's owner (default: $USER)")
    _add_dirs(importer)

    migrate = commands.add_parser("migrate", help="apply database migrations")
    _add_dirs(migrate)

    models = commands.add_parser("models", help="model files: `models smoke`, `models ls`")
    models.add_argument("action", choices=("smoke", "ls"),
                        help="smoke: write the tiny CPU stack; ls: the files live workers hold")
    _add_remote(models)

    _add_render(commands)
    watch = commands.add_parser("watch", help="follow runs with live progress")
    watch.add_argument("runs", nargs="+", metavar="RUN")
    watch.add_argument("-o", "--output", help="also download their takes here")
    _add_remote(watch)
    runs = commands.add_parser("runs", help="the runs you may see, newest first, as a table")
    runs.add_argument("--status", choices=("queued", "running", "succeeded", "failed",
                                           "cancelled"))
    runs.add_argument("--limit", type=_positive, default=50)
    runs.add_argument("--mine", action="store_true",
                      help="only runs you submitted (not your team's; for staff, not everyone's)")
    _add_remote(runs)
    check = commands.add_parser("check", help="the go-live checklist against a live farm")
    check.add_argument("--model", help="the diffusion model file (default: the first held)")
    check.add_argument("--size", type=_size, default=(256, 256), help="WxH (default 256x256)")
    check.add_argument("--steps", type=_positive, default=4, help="steps a render (default 4)")
    check.add_argument("--burst", type=_positive, default=500,
                       help="the most runs the overload check submits (default 500)")
    check.add_argument("--json", action="store_true", help="the results as JSON")
    check.add_argument("--destructive", action="store_true",
                       help="also SIGKILL a worker mid-run (needs a staff token and the worker "
                       "on this host): the run must finish elsewhere exactly once")
    check.add_argument("--gpu", action="store_true",
                       help="also the CUDA paths: bfloat16 on every live CUDA worker (offloading "
                       "ones included) and each multi-GPU split a worker group serves")
    check.add_argument("--only", metavar="NAMES",
                       help="run only these checks (comma-separated: reproducible, isolated, "
                       "memory, cancel, overload, failover, cuda, group)")
    _add_remote(check)
    takes = commands.add_parser("takes", help="`takes get RUN|TAKE -o DIR`: download takes")
    takes.add_argument("action", choices=("get",))
    takes.add_argument("id", help="a run id (all its takes) or a take id")
    takes.add_argument("-o", "--output", default=".", help="where takes go (default: here)")
    _add_remote(takes)

    worker = commands.add_parser(
        "worker", help="join a farm: one worker per GPU of this host (cpu without one)")
    worker.add_argument("--gpus", default="all", help="all (default) or NVML indices: 0,1")
    worker.add_argument("--pool", default=os.environ.get("INLINE_POOL") or "",
                        help="the workers' pool (INLINE_POOL; default: named after the device)")
    worker.add_argument("--name", help="node name prefix (default: the pool): NAME-gpu0@host")
    worker.add_argument("--queues", help="serve exactly these queues (default: from the hardware)")
    worker.add_argument("--parallel", default=os.environ.get("INLINE_PARALLEL") or "",
                        help="one xfuser group over the chosen GPUs, e.g. ulysses=2 "
                        "(INLINE_PARALLEL; serves xfuser.<n>)")
    worker.add_argument("--slots", type=_positive,
                        default=int(os.environ.get("INLINE_WORKER_SLOTS") or 4),
                        help="runs each worker executes at once (default: $INLINE_WORKER_SLOTS or 4)")
    worker.add_argument("--profile", choices=PROFILES, help="device profile (default: auto)")
    worker.add_argument("--lowvram", action="store_true", help="shorthand for --profile lowvram")
    worker.add_argument("--cpu", action="store_true", help="one cpu worker, GPUs or not")
    worker.add_argument("--vram-budget", type=float, metavar="GB",
                        help="cap the VRAM the device policy counts (INLINE_VRAM_BUDGET_GB)")
    worker.add_argument("--cpu-offload", action="store_true",
                        help="keep the text encoder and VAE in CPU memory between uses")
    _add_dirs(worker)

    web = commands.add_parser("web", help="migrate, then serve only the web side (uvicorn)")
    web.add_argument("--listen", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=_port, default=8188, help="HTTP port (default 8188)")
    web.add_argument("--processes", type=_positive, default=1,
                     help="uvicorn worker processes (default 1)")
    _add_dirs(web)

    commands.add_parser("test", help="run the whole test suite (args go to pytest)")
    commands.add_parser("manage", help="manage.py with the farm's environment")
    commands.add_parser("lint", help="ruff check . then mypy . (args go to ruff)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # These pass everything after the command through untouched (argparse would eat `-x`).
    passthrough = {"test": cmd_test, "manage": cmd_manage, "lint": cmd_lint}
    if argv and argv[0] in passthrough:
        return passthrough[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)
    handlers = {"up": cmd_up, "token": cmd_token, "migrate": cmd_migrate, "models": cmd_models,
                "import": cmd_import, "worker": cmd_worker, "web": cmd_web,
                "render": cmd_remote, "watch": cmd_remote, "runs": cmd_remote,
                "takes": cmd_remote, "check": cmd_remote}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
