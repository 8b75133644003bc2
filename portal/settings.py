"""Portal settings: everything from environment variables, with embedded defaults.

One code path: PostgreSQL for the rows, Redis for everything else (broker, results, channel
layer, cache, rate limits, SLI windows). Without DATABASE_URL / REDIS_URL the portal uses its
embedded servers (portal/embedded.py: PostgreSQL and Valkey from pip packages, on 127.0.0.1,
data under PORTAL_DATA_DIR), which `manage.py up` starts before anything else.
PORTAL_ENV=production turns on the hardened settings and requires a real secret key.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal import embedded as portal_embedded
from portal import secrets as portal_secrets

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


PORTAL_ENV = env_str("PORTAL_ENV", "development")
PRODUCTION = PORTAL_ENV == "production"
DATA_DIR = Path(env_str("PORTAL_DATA_DIR", str(BASE_DIR / "var"))).resolve()

# Never a constant: production takes it from the environment; elsewhere it is random, made on
# the first run and kept in the data dir (0600), so the web, worker and beat processes agree.
SECRET_KEY_FILE = Path(env_str("SECRET_KEY_FILE", str(DATA_DIR / "secret_key"))).resolve()
SECRET_KEY = env_str("SECRET_KEY", "")
if PRODUCTION and (len(SECRET_KEY) < 32 or SECRET_KEY.startswith("django-insecure")):
    raise ImproperlyConfigured("SECRET_KEY must be set to a long random value in production")
if not SECRET_KEY:
    SECRET_KEY = portal_secrets.secret_key(SECRET_KEY_FILE)

DEBUG = env_bool("DEBUG", not PRODUCTION)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set in production")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "portal",
    "tenants",
    "serving",
    "incidents",
]

MIDDLEWARE = [
    "portal.requestctx.RequestContextMiddleware",
    "portal.http_metrics.HttpMetricsMiddleware",  # /metrics: requests by route and status
    "portal.tracing.TracingMiddleware",  # a span per request when OTLP is configured
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "portal.middleware.DependencyUnavailableMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.tenancy",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------
# No DATABASE_URL / REDIS_URL: the embedded servers' URLs (started by `manage.py up`).
EMBEDDED = portal_embedded.from_env()
EMBEDDED_POSTGRES = not env_str("DATABASE_URL")
EMBEDDED_REDIS = not env_str("REDIS_URL")
DATABASE_URL = env_str("DATABASE_URL") or EMBEDDED.database_url
# Health checks on reuse: after a PostgreSQL restart the first request reconnects instead
# of failing on a dead persistent connection.
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
}
# The planner's price of a random page read, per session: 1.1 (PG_RANDOM_PAGE_COST), the value
# for data in RAM or on SSD, not PostgreSQL's spinning-disk 4, which prices a tenant's index
# scan above a backward scan of the whole primary key (bench/api_list.py: 0.2 ms vs 0.03 ms).
# Added to any `options` the URL already carries (`?options=-c search_path=...`).
_PG_OPTIONS = DATABASES["default"].setdefault("OPTIONS", {})
_PG_OPTIONS["options"] = " ".join(
    filter(
        None,
        [
            _PG_OPTIONS.get("options"),
            f"-c random_page_cost={env_float('PG_RANDOM_PAGE_COST', 1.1)}",
        ],
    )
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: broker, results, channel layer, cache, rate limits ---------------------------
REDIS_URL = env_str("REDIS_URL") or EMBEDDED.redis_url
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "portal"),
    }
}
# CHANNEL_LAYER=pubsub (default) is channels_redis' RedisPubSubChannelLayer: faster fan-out
# (bench/ws_fanout.py) and it re-subscribes by itself when Redis comes back (the stream
# resumes in ~1 s; `core`, the list-based RedisChannelLayer, took 5.5 s and loses the groups).
_pubsub = env_str("CHANNEL_LAYER", "pubsub") == "pubsub"
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer"
        if _pubsub
        else "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("CHANNEL_PREFIX", "portal:asgi")},
    }
}
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL

CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "portal.beat:PortalScheduler"  # django-celery-beat's, with a heartbeat
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE = {
    "invitations-expire": {
        "task": "tenants.invitations_expire",
        "schedule": 3600.0,
    },
    "deployments-status": {
        "task": "serving.refresh_deployment_status",
        "schedule": float(env_int("DEPLOYMENT_STATUS_INTERVAL_S", 5)),
    },
    "health-tick": {  # the beat: each deployment is checked when due (health_interval_s)
        "task": "serving.health_tick",
        "schedule": env_float("HEALTH_TICK_S", 1.0),
    },
    "consistency-probe": {
        "task": "serving.consistency_probe",
        "schedule": env_float("CONSISTENCY_PROBE_INTERVAL_S", 60.0),
    },
    "sli-prune": {
        "task": "serving.prune_sli_samples",
        "schedule": 60.0,
    },
    "gpu-prune": {
        "task": "serving.prune_gpu_samples",
        "schedule": 60.0,
    },
    "drill-runs-resume": {
        "task": "incidents.resume_drill_runs",
        "schedule": 15.0,
    },
    "notifications-sweep": {
        "task": "incidents.sweep_notifications",
        "schedule": 60.0,
    },
    # One heartbeat per queue, run by that queue's workers (portal.heartbeats).
    **{
        f"heartbeat-{queue}": {
            "task": "portal.heartbeat",
            "schedule": 10.0,
            "args": (queue,),
            "options": {"queue": queue, "expires": 10.0},
        }
        for queue in ("default", "health", "chaos", "validation", "checks")
    },
}

# --- Auth -------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# --- Single sign-on (OIDC) and two-factor (docs/operations.md) ----------------------------
# OpenID Connect beside passwords (tenants.oidc, mozilla-django-oidc): off unless
# OIDC_RP_CLIENT_ID is set. Endpoints come from OIDC_OP_DISCOVERY_URL (fetched on first use)
# unless given one by one; ID tokens are RS256, checked against the provider's JWKS.
OIDC_ROLE_NAMES = ("owner", "operator", "viewer")  # tenants.models.Role (a test keeps them equal)
_OIDC_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,50}$")


def oidc_group_roles(raw: str) -> dict[str, dict[str, str]]:
    """OIDC_GROUP_ROLES: {"<group>": {"tenant": "<slug>", "role": "<role>"}, ...}, checked."""
    try:
        value = json.loads(raw or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"OIDC_GROUP_ROLES is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ImproperlyConfigured("OIDC_GROUP_ROLES must be a JSON object keyed by group name")
    roles: dict[str, dict[str, str]] = {}
    for group, grant in value.items():
        where = f"OIDC_GROUP_ROLES[{group!r}]"
        if not group.strip() or not isinstance(grant, dict) or set(grant) != {"tenant", "role"}:
            raise ImproperlyConfigured(f'{where} must be {{"tenant": "<slug>", "role": "<role>"}}')
        if not isinstance(grant["tenant"], str) or not _OIDC_SLUG.match(grant["tenant"]):
            raise ImproperlyConfigured(f"{where}.tenant is not a tenant slug: {grant['tenant']!r}")
        if grant["role"] not in OIDC_ROLE_NAMES:
            raise ImproperlyConfigured(
                f"{where}.role must be one of {', '.join(OIDC_ROLE_NAMES)}, not {grant['role']!r}"
            )
        roles[group] = {"tenant": grant["tenant"], "role": grant["role"]}
    return roles


OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_OP_DISCOVERY_URL = env_str("OIDC_OP_DISCOVERY_URL")
OIDC_OP_ISSUER = env_str("OIDC_OP_ISSUER")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_OP_JWKS_ENDPOINT")
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid email profile")
OIDC_USE_PKCE = env_bool("OIDC_USE_PKCE", True)
OIDC_TIMEOUT = env_float("OIDC_TIMEOUT_S", 10.0)
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_GROUP_ROLES = oidc_group_roles(env_str("OIDC_GROUP_ROLES"))
OIDC_AUTHENTICATE_CLASS = "tenants.oidc.AuthenticateView"
OIDC_CALLBACK_CLASS = "tenants.oidc.CallbackView"
if OIDC_ENABLED:
    if not OIDC_RP_CLIENT_SECRET:
        raise ImproperlyConfigured("OIDC_RP_CLIENT_ID is set: set OIDC_RP_CLIENT_SECRET too")
    _endpoints = {
        "OIDC_OP_AUTHORIZATION_ENDPOINT": OIDC_OP_AUTHORIZATION_ENDPOINT,
        "OIDC_OP_TOKEN_ENDPOINT": OIDC_OP_TOKEN_ENDPOINT,
        "OIDC_OP_USER_ENDPOINT": OIDC_OP_USER_ENDPOINT,
        "OIDC_OP_JWKS_ENDPOINT": OIDC_OP_JWKS_ENDPOINT,
    }
    _missing = [name for name, url in _endpoints.items() if not url]
    if _missing and not OIDC_OP_DISCOVERY_URL:
        raise ImproperlyConfigured(
            f"OIDC is on: set OIDC_OP_DISCOVERY_URL, or {', '.join(_missing)}"
        )
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    *(["tenants.oidc.Backend"] if OIDC_ENABLED else []),
]
# Two-factor (tenants.mfa): wrong codes per user per AUTH_THROTTLE_WINDOW_S, and how long
# a password that was right waits for its code.
TOTP_THROTTLE_PER_USER = env_int("TOTP_THROTTLE_PER_USER", 5)
TOTP_PENDING_S = env_int("TOTP_PENDING_S", 300)
TOTP_ISSUER = env_str("TOTP_ISSUER", "AI Ops Portal")

# --- E-mail -----------------------------------------------------------------------------
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if PRODUCTION
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(DATA_DIR / "mail"))
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "AI Ops Portal <noreply@localhost>")
PORTAL_BASE_URL = env_str("PORTAL_BASE_URL", "http://127.0.0.1:8000")

# --- i18n / static ----------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    # Front-end packages are installed by npm (package.json); only their dist folders are served.
    ("vendor/htmx", BASE_DIR / "node_modules" / "htmx.org" / "dist"),
    ("vendor/uplot", BASE_DIR / "node_modules" / "uplot" / "dist"),
    # The contract editor: CodeMirror 5 (one script, no bundler), its YAML mode and lint add-on.
    ("vendor/codemirror/lib", BASE_DIR / "node_modules" / "codemirror" / "lib"),
    ("vendor/codemirror/yaml", BASE_DIR / "node_modules" / "codemirror" / "mode" / "yaml"),
    ("vendor/codemirror/lint", BASE_DIR / "node_modules" / "codemirror" / "addon" / "lint"),
]
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# --- REST API ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.IdCursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "AI Ops Portal API",
    "DESCRIPTION": (
        "Tenant-scoped control-plane API: tenants, members, tokens, quotas, audit, models, "
        "deployments, SLA contracts, health, rollouts, rollbacks, incidents."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Several models have a `status` choice field; name each enum after its model.
    "ENUM_NAME_OVERRIDES": {
        "VersionStatusEnum": "serving.registry.models.VersionStatus",
        "DeploymentStatusEnum": "serving.deployments.models.DeploymentStatus",
        "RollbackStatusEnum": "serving.ops.models.RollbackStatus",
        "IncidentStatusEnum": "incidents.models.IncidentStatus",
        "SeverityEnum": "incidents.models.Severity",
        "EventKindEnum": "incidents.models.EventKind",
        "BreachKindEnum": "incidents.models.BreachKind",
        "BreachGroupEnum": "incidents.models.BreachGroup",
        "BreachActionEnum": "incidents.models.BreachAction",
        "ChannelKindEnum": "incidents.notifications.models.ChannelKind",
        "RuleOpEnum": "incidents.models.RuleOp",
        "DrillStatusEnum": "incidents.drills.models.DrillStatus",
        "DrillSlotEnum": "incidents.drills.models.DrillSlot",
        "FaultKindEnum": "incidents.drills.models.FaultKind",
        "RevertStrategyEnum": "incidents.drills.models.RevertStrategy",
    },
}

# --- Portal -----------------------------------------------------------------------------
API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90)
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365)
# Per-process cache of authenticated tokens; revocation is still immediate (Redis marker).
API_TOKEN_CACHE_SECONDS = env_int("API_TOKEN_CACHE_SECONDS", 10)
INVITATION_TTL = timedelta(days=env_int("INVITATION_TTL_DAYS", 7))
RATE_LIMIT_BURST_SECONDS = env_int("RATE_LIMIT_BURST_SECONDS", 1)
RATE_LIMIT_KEY_PREFIX = env_str("RATE_LIMIT_KEY_PREFIX", "portal:rl")
# Prefix-cache salts (HMAC of the current KV secret and the tenant id) and probe keys come
# from the KV secret, kept apart from SECRET_KEY so that it can be rotated on its own
# (`manage.py rotate_kv_secret`, portal.secrets): from the environment (KV_CACHE_SECRET, and
# KV_CACHE_SECRET_PREVIOUS during a rotation's grace), else from KV_SECRET_FILE, made on first
# use and re-read by every process when it changes. The data dir must be shared by the web,
# worker and beat processes (or set the environment variables on all of them).
KV_CACHE_SECRET = env_str("KV_CACHE_SECRET", "")
KV_CACHE_SECRET_PREVIOUS = env_str("KV_CACHE_SECRET_PREVIOUS", "")
KV_SECRET_FILE = Path(env_str("KV_SECRET_FILE", str(DATA_DIR / "kv_secret"))).resolve()
SLI_KEY_PREFIX = env_str("SLI_KEY_PREFIX", "portal")
# The GPU agent (serving.gpu_agent): samples a second, the node's name, and whether a machine
# without a GPU streams the simulated provider (labelled simulated on every chart; `make up`
# switches it on). METRICS_TOKEN protects /metrics (Prometheus); empty: /metrics is off.
DRILL_RESUME_AFTER_S = env_float("DRILL_RESUME_AFTER_S", 15.0)  # a drill run's lost step
GPU_AGENT_HZ = env_float("GPU_AGENT_HZ", 5.0)
GPU_AGENT_NODE = env_str("GPU_AGENT_NODE", "")
GPU_AGENT_SIMULATE = env_bool("GPU_AGENT_SIMULATE", False)
# `process`: `manage.py gpu_agent` on each GPU node (the `up` supervisor starts it on this one);
# `ray`: a sampler per Ray node declared with the deployments (serving.dataplane.gpu_node) and
# one relay beside the portal (`manage.py gpu_agent --relay`).
GPU_AGENT_MODE = env_str("GPU_AGENT_MODE", "process")
if GPU_AGENT_MODE not in ("process", "ray"):
    raise ImproperlyConfigured("GPU_AGENT_MODE: give `process` or `ray`.")
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# --- The ops loop -------------------------------------------------------------------------
# The health tick split into this many shards (deployment id % HEALTH_SHARDS), one task and
# one lease each, ticked by whichever health workers are free (serving.ops.health.lease).
HEALTH_SHARDS = env_int("HEALTH_SHARDS", 1)
# A deployment with a canary in flight is checked this often (or at its own interval if
# shorter); the health tick's beat (HEALTH_TICK_S) is the finest step either can take.
HEALTH_CANARY_INTERVAL_S = env_float("HEALTH_CANARY_INTERVAL_S", 1.0)
if not 0 < HEALTH_CANARY_INTERVAL_S <= 300:
    raise ImproperlyConfigured("HEALTH_CANARY_INTERVAL_S: give seconds, above 0 and up to 300.")
HEALTH_PROBES = env_bool("HEALTH_PROBES", True)  # synthetic probes through the Serve proxy
HEALTH_PROBE_TIMEOUT_S = env_float("HEALTH_PROBE_TIMEOUT_S", 5.0)
# Failed probes in a row before the stable slot fires a `probe` alert (0: never).
HEALTH_PROBE_ALERT_AFTER = env_int("HEALTH_PROBE_ALERT_AFTER", 1)
# A revision serving without canary and without breach this long becomes the "last good" one.
HEALTH_GOOD_AFTER_S = env_float("HEALTH_GOOD_AFTER_S", 60.0)
# A rollback left pending/switching this long (its worker died) is enqueued again.
ROLLBACK_RESUME_AFTER_S = env_float("ROLLBACK_RESUME_AFTER_S", 10.0)
# Every deployment change enqueues one reconcile on commit (off in unit tests without Ray).
RECONCILE_ON_COMMIT = env_bool("RECONCILE_ON_COMMIT", True)
# A version replica's hot reload that takes longer fails, the old weights keep serving (s).
RELOAD_DEADLINE_S = env_float("RELOAD_DEADLINE_S", 60.0)
# Admission asks Ray whether a deployment's replicas fit (serving.deployments.capacity).
CLUSTER_CAPACITY = env_bool("PORTAL_CLUSTER_CAPACITY", True)
# Fast buckets (>= 2 / FRACTION req/s) lease a share of their rate per Redis round trip.
RATE_LIMIT_LEASE_FRACTION = env_float("RATE_LIMIT_LEASE_FRACTION", 0.01)
RATE_LIMIT_LEASE_MAX = env_int("RATE_LIMIT_LEASE_MAX", 64)
RATE_LIMIT_LEASE_MS = env_int("RATE_LIMIT_LEASE_MS", 100)

# --- Model artifacts ---------------------------------------------------------------------
# Uploaded checkpoints are unpacked under the store (a shared filesystem when Ray runs on
# several nodes). Local paths may be registered only under ARTIFACT_LOCAL_ROOTS (never inside
# the store); production has no default roots, so registering by path is off until set.
ARTIFACT_STORE_DIR = Path(env_str("ARTIFACT_STORE_DIR", str(DATA_DIR / "artifacts"))).resolve()
ARTIFACT_UPLOAD_MAX_BYTES = env_int("ARTIFACT_UPLOAD_MAX_BYTES", 2 * 1024**3)
# Every other request body (API JSON, forms, contract YAML): portal.bodylimit caps it in ASGI
# as it streams in; Django's own limit says the same under WSGI (tests, runserver).
REQUEST_BODY_MAX_BYTES = env_int("REQUEST_BODY_MAX_BYTES", 1024**2)
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_MAX_BYTES
# WebSocket frames: the portal's streams are one-way, so a client has nothing large to send
# (uvicorn's default is 16 MiB a message; portal.serve passes this instead).
WS_MAX_BYTES = env_int("WS_MAX_BYTES", 16 * 1024)
ARTIFACT_LOCAL_ROOTS = [
    Path(root).resolve()
    for root in env_list(
        "ARTIFACT_LOCAL_ROOTS", [] if PRODUCTION else [str(DATA_DIR), tempfile.gettempdir()]
    )
]
# How replicas get a version's files (serving.registry.delivery): `path` reads them where the
# portal has them (one host, or a filesystem every Ray node mounts); `portal` fetches a tar from
# the portal by a signed URL that expires (PORTAL_INTERNAL_URL: the portal as Ray nodes reach
# it); `s3` from S3-compatible storage (ARTIFACT_S3_*; credentials from the environment, the
# portal's to upload, each node's to read). Fetched files are checksummed and cached per node.
# Default: `path` with the portal's own local head, `portal` against an existing cluster.
ARTIFACT_DELIVERY = env_str("ARTIFACT_DELIVERY").strip() or (
    "portal" if env_str("RAY_ADDRESS") or env_str("RAY_DASHBOARD_URL") else "path"
)
if ARTIFACT_DELIVERY not in ("path", "portal", "s3"):
    raise ImproperlyConfigured(
        f"ARTIFACT_DELIVERY must be path, portal or s3, not {ARTIFACT_DELIVERY!r}"
    )
PORTAL_INTERNAL_URL = env_str("PORTAL_INTERNAL_URL").rstrip("/")
# A signed URL stays the same for this long and is valid at least this long after (a periodic
# reconcile renews it: only user_config changes, no replica restarts).
ARTIFACT_URL_TTL_S = env_int("ARTIFACT_URL_TTL_S", 6 * 3600)
ARTIFACT_S3_BUCKET = env_str("ARTIFACT_S3_BUCKET")
ARTIFACT_S3_PREFIX = env_str("ARTIFACT_S3_PREFIX", "portal-artifacts/")
ARTIFACT_S3_ENDPOINT_URL = env_str("ARTIFACT_S3_ENDPOINT_URL")
ARTIFACT_S3_REGION = env_str("ARTIFACT_S3_REGION", "us-east-1")
if ARTIFACT_DELIVERY == "s3" and not ARTIFACT_S3_BUCKET:
    raise ImproperlyConfigured("ARTIFACT_DELIVERY=s3 needs ARTIFACT_S3_BUCKET")
if ARTIFACT_DELIVERY == "portal" and not PORTAL_INTERNAL_URL:
    raise ImproperlyConfigured(
        "ARTIFACT_DELIVERY=portal (the default with RAY_ADDRESS) needs PORTAL_INTERNAL_URL: the "
        "portal's web address as the Ray nodes reach it, e.g. http://portal.internal:8000 (or "
        "ARTIFACT_DELIVERY=path when every node sees the portal's files at the same path)"
    )
if ARTIFACT_DELIVERY == "portal":  # signed URLs are renewed by a reconcile (user_config only)
    CELERY_BEAT_SCHEDULE["artifact-urls-renew"] = {
        "task": "serving.reconcile",
        "schedule": max(60.0, ARTIFACT_URL_TTL_S / 4),
    }

# --- Logging: secrets are scrubbed from every record ------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
# plain: one human line a record; json: one object a line, with request_id and trace_id.
LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact_secrets": {"()": "portal.logging.RedactSecretsFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "portal.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["redact_secrets"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # One line per request of the health tick's probes and webhooks would drown the log.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- Tenant safety (docs/architecture.md "Tenant safety") ---------------------------------
# Checkpoint validation bounds (serving.engine.config.ConfigLimits), checked before anything
# sized by the config is built; a worker killed this many times mid-validation fails the version.
ENGINE_MAX_POSITION_EMBEDDINGS = env_int("ENGINE_MAX_POSITION_EMBEDDINGS", 131072)
ENGINE_MAX_VOCAB_SIZE = env_int("ENGINE_MAX_VOCAB_SIZE", 1 << 20)
ENGINE_MAX_HIDDEN_SIZE = env_int("ENGINE_MAX_HIDDEN_SIZE", 65536)
ENGINE_MAX_INTERMEDIATE_SIZE = env_int("ENGINE_MAX_INTERMEDIATE_SIZE", 262144)
ENGINE_MAX_HIDDEN_LAYERS = env_int("ENGINE_MAX_HIDDEN_LAYERS", 512)
ENGINE_MAX_ATTENTION_HEADS = env_int("ENGINE_MAX_ATTENTION_HEADS", 1024)
ENGINE_MAX_HEAD_DIM = env_int("ENGINE_MAX_HEAD_DIM", 1024)
ENGINE_VALIDATION_MAX_BYTES = env_int("ENGINE_VALIDATION_MAX_BYTES", 2 * 1024**3)
ENGINE_MAX_TOKENIZER_BYTES = env_int("ENGINE_MAX_TOKENIZER_BYTES", 64 * 1024**2)
ENGINE_MAX_SAFETENSORS_HEADER_BYTES = env_int("ENGINE_MAX_SAFETENSORS_HEADER_BYTES", 16 * 1024**2)
ENGINE_MAX_TENSORS = env_int("ENGINE_MAX_TENSORS", 16384)
MODEL_VALIDATION_MAX_ATTEMPTS = env_int("MODEL_VALIDATION_MAX_ATTEMPTS", 3)
# vLLM (serving/engine/vllm): the most KV cache a CPU replica may ask for (engine
# cpu_kv_space_gib), so no tenant's replica takes its node's memory.
VLLM_MAX_CPU_KV_GIB = env_float("VLLM_MAX_CPU_KV_GIB", 4.0)
# Non-public networks webhooks may reach (CIDR, comma-separated); empty = public addresses only.
WEBHOOK_ALLOWED_NETWORKS = env_list("WEBHOOK_ALLOWED_NETWORKS", [])
# Tenants one user may own (platform staff are exempt); signup open | verify | closed.
MAX_TENANTS_PER_USER = env_int("MAX_TENANTS_PER_USER", 3)
SIGNUP_MODE = env_str("SIGNUP_MODE", "verify" if PRODUCTION else "open")
SIGNUP_VERIFY_TTL_HOURS = env_int("SIGNUP_VERIFY_TTL_HOURS", 48)
# Login and signup attempts per window, checked before any password (429 + Retry-After).
LOGIN_THROTTLE_PER_EMAIL = env_int("LOGIN_THROTTLE_PER_EMAIL", 10)
LOGIN_THROTTLE_PER_IP = env_int("LOGIN_THROTTLE_PER_IP", 50)
SIGNUP_THROTTLE_PER_IP = env_int("SIGNUP_THROTTLE_PER_IP", 10)
AUTH_THROTTLE_WINDOW_S = env_int("AUTH_THROTTLE_WINDOW_S", 300)
# A replica's own memory share (drill leaks and deployment faults take at most a share of it).
REPLICA_MB_PER_CPU = env_int("REPLICA_MB_PER_CPU", 2048)
REPLICA_MB_PER_GPU = env_int("REPLICA_MB_PER_GPU", 81920)
DRILL_LEAK_MAX_SHARE = env_float("DRILL_LEAK_MAX_SHARE", 0.5)

# --- Production hardening ---------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
