"""Settings: one module, read from the environment only (see deploy/env.example for every variable)."""

from __future__ import annotations

from pathlib import Path

from inline_farm.env import (
    ImproperlyConfiguredEnv,
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_networks,
    env_path,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("INLINE_REQUIRE_SECRET_KEY", False):
        raise ImproperlyConfiguredEnv("SECRET_KEY is not set")
    # A per-checkout development key; production sets SECRET_KEY (INLINE_REQUIRE_SECRET_KEY=1
    # makes its absence fatal).
    SECRET_KEY = "inline-farm-insecure-development-key-set-SECRET_KEY-in-production"
# Safe by default: the farm answers only to this machine's names until ALLOWED_HOSTS lists the
# host names clients use (`./farm up --listen 0.0.0.0` on a LAN needs it).
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# Behind TLS: cookies (admin session, CSRF) only over HTTPS, and trust the proxy's scheme header.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
_proxy_ssl_header = env_str("SECURE_PROXY_SSL_HEADER", "")
if _proxy_ssl_header:
    if _proxy_ssl_header.count("=") != 1:
        raise ImproperlyConfiguredEnv(
            f"SECURE_PROXY_SSL_HEADER={_proxy_ssl_header!r} must be HEADER=value "
            "(e.g. X-Forwarded-Proto=https)"
        )
    _name, _value = _proxy_ssl_header.split("=")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _name.strip().upper().replace("-", "_"), _value.strip())

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # serves /v1/docs' swagger-ui from its bundled static files, not a CDN
    "channels",
    "apps.accounts",
    "apps.graphs",
    "apps.runs",
    "apps.takes",
    "apps.fleet",
    "apps.importer",
]

MIGRATION_MODULES = {
    "accounts": "migrations.accounts",
    "graphs": "migrations.graphs",
    "runs": "migrations.runs",
    "takes": "migrations.takes",
    "fleet": "migrations.fleet",
    "importer": "migrations.importer",
}

MIDDLEWARE = [
    "inline_farm.middleware.ApiMethods",
    "inline_farm.middleware.UploadSizeLimit",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "inline_farm.middleware.SyncChain",  # last: the whole chain runs in one thread hop
]
ROOT_URLCONF = "inline_farm.urls"
ASGI_APPLICATION = "inline_farm.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/inline_farm")
    )
}
# A psycopg connection pool per process (Django's own `pool` option): opening a PostgreSQL
# connection costs ~3 ms, several times the queries of a whole request. CONN_HEALTH_CHECKS has
# the pool ping a connection as it leaves it, so one whose server session was terminated (or a
# restarted server) is replaced, not handed out.
INLINE_DB_POOL_SIZE = env_int("INLINE_DB_POOL_SIZE", 24, minimum=2)
_db_options: dict[str, object] = {
    "pool": {"min_size": 1, "max_size": INLINE_DB_POOL_SIZE, "timeout": 20},
}
# Server-side parameter binding (Django's documented `server_side_binding` and
# `prepare_threshold` options): psycopg prepares a statement once a connection has run it
# `INLINE_DB_PREPARE_THRESHOLD` times, and PostgreSQL parses and plans it once per connection
# instead of on every call — the dispatcher's heads read planned in ~1 ms and ran in ~0.1 ms.
# 0 turns it off (Django's default: client-side binding, nothing prepared), e.g. behind a
# transaction-pooling proxy that keeps no prepared statements.
INLINE_DB_PREPARE_THRESHOLD = env_int("INLINE_DB_PREPARE_THRESHOLD", 5, minimum=0)
if INLINE_DB_PREPARE_THRESHOLD:
    _db_options.update(server_side_binding=True, prepare_threshold=INLINE_DB_PREPARE_THRESHOLD)
DATABASES["default"]["OPTIONS"] = _db_options
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
LOGIN_URL = "/login/"  # the ComfyUI editor's login (apps/importer/comfy_editor.py)
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Farm paths -------------------------------------------------------------------------------
INLINE_DATA_DIR = env_path("INLINE_DATA_DIR", BASE_DIR / "data")
INLINE_MODELS_DIR = env_path("INLINE_MODELS_DIR", BASE_DIR / "models")
INLINE_BLOB_DIR = INLINE_DATA_DIR / "blobs"

# --- Broker, channel layer --------------------------------------------------------------------
BROKER_URL = env_str("BROKER_URL", "redis://127.0.0.1:6379/0")
CHANNEL_REDIS_URL = env_str("CHANNEL_REDIS_URL", "redis://127.0.0.1:6379/1")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "inline_farm.channel_layer.FarmChannelLayer",  # group_send in fewer round trips
        "CONFIG": {
            # redis-py 8 defaults socket_timeout to 5 s, which is also channels-redis' BZPOPMIN
            # timeout: an idle websocket's receive then dies with "Timeout reading". Read longer.
            "hosts": [{"address": CHANNEL_REDIS_URL, "socket_timeout": 30}],
            "prefix": env_str("INLINE_CHANNEL_PREFIX", "inline"),
            "capacity": 1000,
            "expiry": 30,
        },
    }
}

# --- Run scheduling ---------------------------------------------------------------------------
# The lease is the last line of defence: a worker that stops heartbeating is declared lost after
# INLINE_WORKER_LOST_SECONDS and its runs are requeued at once (apps/runs/dispatch.py).
INLINE_LEASE_SECONDS = env_float("INLINE_LEASE_SECONDS", 60.0, minimum=1.0)
INLINE_MAX_ATTEMPTS = env_int("INLINE_MAX_ATTEMPTS", 3, minimum=1)
INLINE_REAPER_INTERVAL = env_float("INLINE_REAPER_INTERVAL", 1.0, minimum=0.2)
# A published run not claimed within this many seconds is published again (lost message).
INLINE_REDISPATCH_SECONDS = env_float("INLINE_REDISPATCH_SECONDS", 3.0, minimum=0.5)
# Unclaimed messages per queue beyond its free slots (0: publish only into free slots).
INLINE_DISPATCH_WINDOW = env_int("INLINE_DISPATCH_WINDOW", 0, minimum=0)
INLINE_WORKER_HEARTBEAT = env_float("INLINE_WORKER_HEARTBEAT", 2.0, minimum=0.2)
INLINE_WORKER_LOST_SECONDS = env_float("INLINE_WORKER_LOST_SECONDS", 10.0, minimum=1.0)
INLINE_WORKER_SLOTS = env_int("INLINE_WORKER_SLOTS", 4, minimum=1)
# CPU nice increment of run-executing workers, so the web and control worker go first on a
# shared machine (0: none).
INLINE_WORKER_NICE = env_int("INLINE_WORKER_NICE", 5, minimum=0)
# SIGTERM: a worker takes no new run; runs still going after this many seconds are handed back.
INLINE_WORKER_GRACE_SECONDS = env_float("INLINE_WORKER_GRACE_SECONDS", 10.0, minimum=0.0)
INLINE_WORKER_QUEUES = env_str("INLINE_WORKER_QUEUES", "")
INLINE_POOL = env_str("INLINE_POOL", "")
INLINE_AUTO_GPU_QUEUE = env_bool("INLINE_AUTO_GPU_QUEUE", True)
# Networks (CIDRs, comma-separated) that may scrape GET /metrics without a token; else staff only.
INLINE_METRICS_ALLOW = env_networks("INLINE_METRICS_ALLOW")
# The worker's node-output cache, in MB (0: a tenth of the machine's memory, at most 4 GiB).
INLINE_NODE_CACHE_MB = env_int("INLINE_NODE_CACHE_MB", 0, minimum=0)
# A run writes its buffered events (node_done, progress) at most this often (seconds): an event
# that long after the last write is written at once, the others with the next write; a node that
# takes longer writes its events as it ends. Fast graphs: one write with the finish.
INLINE_EVENT_FLUSH_SECONDS = env_float("INLINE_EVENT_FLUSH_SECONDS", 0.05, minimum=0.0)

# --- Limits -----------------------------------------------------------------------------------
INLINE_ASSET_MAX_BYTES = env_int("INLINE_ASSET_MAX_BYTES", 50 * 1024 * 1024, minimum=1)
INLINE_MAX_IMAGE_PIXELS = env_int("INLINE_MAX_IMAGE_PIXELS", 8192 * 8192, minimum=1)
# Each user's ComfyUI user directory (the editor's saved workflows and settings, ComfyUserFile):
# at most this many bytes and files; a write past either is refused (507), nothing written.
INLINE_COMFY_USERDATA_MAX_BYTES = env_int("INLINE_COMFY_USERDATA_MAX_BYTES", 64 * 1024 * 1024,
                                          minimum=0)
INLINE_COMFY_USERDATA_MAX_FILES = env_int("INLINE_COMFY_USERDATA_MAX_FILES", 2000, minimum=1)
INLINE_MAX_GRAPH_NODES = env_int("INLINE_MAX_GRAPH_NODES", 500, minimum=1)
# A ComfyUI workflow the importer reads (/v1/import/comfy, the door's /prompt): at most this many
# nodes once its subgraphs are flattened, and subgraphs nested at most this deep. Checked before
# anything is expanded: ten instances of a subgraph of ten instances of… is a 422 `too_large`.
# The largest real workflows hold a few hundred nodes and nest subgraphs two or three deep.
INLINE_IMPORT_MAX_NODES = env_int("INLINE_IMPORT_MAX_NODES", 2000, minimum=1)
INLINE_IMPORT_MAX_DEPTH = env_int("INLINE_IMPORT_MAX_DEPTH", 16, minimum=1)
INLINE_MAX_INFLIGHT_RUNS_PER_USER = env_int("INLINE_MAX_INFLIGHT_RUNS_PER_USER", 100, minimum=1)
# Every request body but an asset upload (a graph document is a few KiB): over it, a 413.
INLINE_MAX_BODY_BYTES = env_int("INLINE_MAX_BODY_BYTES", 4 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = INLINE_ASSET_MAX_BYTES + 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

# --- Device policy (read by the worker; listed here so every variable lives in one place) ------
INLINE_PROFILE = env_choice("INLINE_PROFILE", "auto", ("auto", "gpu-max", "lowvram", "cpu"))
INLINE_VRAM_BUDGET_GB = env_float("INLINE_VRAM_BUDGET_GB", 0.0, minimum=0.0)
INLINE_CPU_OFFLOAD = env_bool("INLINE_CPU_OFFLOAD", False)
INLINE_ATTENTION = env_str("INLINE_ATTENTION", "native")
# The most items / latent tokens one batched forward may hold (0: the profile's default).
INLINE_BATCH_ITEMS = env_int("INLINE_BATCH_ITEMS", 0, minimum=0)
INLINE_BATCH_TOKENS = env_int("INLINE_BATCH_TOKENS", 0, minimum=0)
# A multi-GPU worker group (workers/parallel/config.py): off, auto, or degrees such as
# ulysses=2,ring=2 or cfg=2,ulysses=2; checked against the queues and GPUs at worker start.
INLINE_PARALLEL = env_str("INLINE_PARALLEL", "")
INLINE_MODEL_CACHE_SIZE = env_int("INLINE_MODEL_CACHE_SIZE", 4, minimum=1)
# Sampling previews in progress events: at most one per this many seconds; 0 every step, -1 off.
INLINE_PREVIEW_SECONDS = env_float("INLINE_PREVIEW_SECONDS", 1.0, minimum=-1.0)

# --- Celery -----------------------------------------------------------------------------------
CELERY_BROKER_URL = BROKER_URL
CELERY_TASK_IGNORE_RESULT = True
# Celery's thread pool, waking the worker's loop as a slot frees (workers/pool.py: why).
CELERY_WORKER_POOL = "workers.pool:ThreadPool"
CELERY_RESULT_BACKEND = None
# Postgres is the source of truth: a message is acked on receipt and a lost one is re-published
# by the dispatcher (queued runs) or the reaper (expired leases). acks_late would only add
# broker-specific redelivery delays (Redis visibility timeout, RabbitMQ consumer_timeout).
CELERY_TASK_ACKS_LATE = False
# For the same reason Redis does not emulate acks: with acks on receipt, kombu's emulation only
# guarded the moment between the pop and the ack, at the cost of two Redis transactions per
# message (an unacked hash and index entry written, then removed) and a restore poll, ~1/10 of
# a worker's CPU on quick runs (py-spy, bench/hotpath.py). A message lost in that moment is
# re-published by the dispatcher like any other (INLINE_REDISPATCH_SECONDS).
_REDIS_BROKER = BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://"))
CELERY_BROKER_TRANSPORT_OPTIONS = {"ack_emulation": False} if _REDIS_BROKER else {}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A worker whose slots are all busy takes no message (Redis): otherwise, acked at start, it
# reserves the next one while another worker's slot stands free (measured: a run waited a whole
# run's length behind a free slot, tests/e2e/test_batching.py). RabbitMQ ignores it.
CELERY_WORKER_DISABLE_PREFETCH = True
CELERY_TASK_DEFAULT_QUEUE = "cpu"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {
        "task": "apps.runs.tasks.reap_and_dispatch",
        "schedule": INLINE_REAPER_INTERVAL,
        "options": {"queue": "control", "expires": INLINE_REAPER_INTERVAL * 2},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # httpx logs every request at INFO: the benches' and tests' clients printed each one.
        "httpx": {"level": "WARNING"},
        # Celery logs two INFO lines per task (received; succeeded in …s): ~4% of a worker's CPU
        # on quick runs (py-spy, bench/hotpath.py), and a line per run that says less than the
        # run's own events. Failures are still logged (ERROR); `LOG_LEVEL` does not bring these
        # back: set CELERY_TASK_LOG_LEVEL=INFO for that.
        "celery.worker.strategy": {"level": env_str("CELERY_TASK_LOG_LEVEL", "WARNING")},
        "celery.app.trace": {"level": env_str("CELERY_TASK_LOG_LEVEL", "WARNING")},
    },
}
