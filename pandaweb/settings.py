"""Settings for pandaweb, configured only by environment variables.

With no variables set, pandaweb runs embedded: SQLite, an in-memory channel layer and runs
executed in threads of the server process. ``DATABASE_URL`` and ``REDIS_URL`` switch it to
PostgreSQL, Redis and separate Celery workers.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from pandaweb.localfiles import CREDENTIAL_KEYS_FILE, SECRET_KEY_FILE, VAPID_KEY_FILE
from pandaweb.sso.config import OidcSettings, parse_role_map
from sessions.engine.config import (
    ACCELERATORS,
    BEGIN_FRAME_MODES,
    MICROVM_MIN_MEMORY_MIB,
    NAMESPACE_MODES,
    EngineConfig,
)
from workflows.vault import check_key

# Lets generic admin and queryset annotations (ModelAdmin[Run]) work at run time.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}")
    return value


def env_absolute_path(name: str, default: Path) -> Path:
    raw = env_str(name)
    if not raw:
        return default
    path = Path(raw).expanduser()
    if not path.is_absolute():
        # Relative to what? The worker, the web process and a shell each have their own cwd.
        raise ImproperlyConfigured(f"{name}={raw!r} must be an absolute path")
    return path


def engine_config() -> EngineConfig:
    """The engine's settings from the environment, starting from the engine's own defaults.

    The engine reads no environment itself: this is the one place its variables are read.
    """
    default = EngineConfig()
    return EngineConfig(
        sandbox_dir=Path(env_str("PANDAWEB_SANDBOX_DIR", str(default.sandbox_dir))),
        chromium=env_str("PANDAWEB_CHROMIUM", default.chromium),
        local_namespaces=env_choice(
            "PANDAWEB_LOCAL_NAMESPACES", default.local_namespaces, NAMESPACE_MODES
        ),
        begin_frame=env_choice("PANDAWEB_BEGIN_FRAME", default.begin_frame, BEGIN_FRAME_MODES),
        microvm_image_dir=env_absolute_path(
            "PANDAWEB_MICROVM_IMAGE_DIR", default.microvm_image_dir
        ),
        microvm_accelerator=env_choice(
            "PANDAWEB_MICROVM_ACCEL", default.microvm_accelerator, ACCELERATORS
        ),
        microvm_memory_mib=env_int(
            "PANDAWEB_MICROVM_MEMORY_MIB",
            default.microvm_memory_mib,
            minimum=MICROVM_MIN_MEMORY_MIB,
        ),
        microvm_pool=env_int("PANDAWEB_MICROVM_POOL", default.microvm_pool, minimum=0),
        pandastack_template=env_str("PANDAWEB_PANDASTACK_TEMPLATE", default.pandastack_template),
        pandastack_api=env_str("PANDASTACK_API", default.pandastack_api),
        pandastack_api_key=env_str("PANDASTACK_API_KEY", default.pandastack_api_key),
    )


# Run threads and the web server share one file: wait for the write lock instead of failing at
# once, take it at BEGIN (the audit chain relies on that to serialize writers), and let readers
# proceed while one writer works.
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def database_from_url(
    name: str, url: str, *, pool_max: int = 10, pool_timeout: int = 10
) -> dict[str, Any]:
    """Parse a database URL, turning the library's varied exceptions into one readable error.

    PostgreSQL connections come from a pool of at most ``pool_max`` per process; a request waits
    at most ``pool_timeout`` seconds for one. ``pool_max=0``: no pool and no persistent
    connection, each request or unit of work connects and closes (behind PgBouncer, say).
    """
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in {"postgres", "postgresql", "pgsql", "sqlite"}:
        raise ImproperlyConfigured(
            f"{name}={url!r} is not a database URL: expected "
            "postgresql://user:password@host:port/dbname or sqlite:///path/to/db.sqlite3"
        )
    # Persistent connections belong to the thread that opened them, and daphne runs each request
    # on a thread of its own: they piled up idle until PostgreSQL ran out of connections. A
    # pool bounds them per process, and hands out only connections that pass a check (a
    # restarted server or a terminated backend costs nobody an error).
    conn_max_age = 60 if scheme == "sqlite" else 0
    try:
        config = dj_database_url.parse(url, conn_max_age=conn_max_age, conn_health_checks=True)
    except Exception as exc:  # the library raises ValueError, KeyError or its own types
        raise ImproperlyConfigured(f"{name}={url!r} could not be parsed: {exc}") from None
    if scheme == "sqlite":
        config["OPTIONS"] = dict(SQLITE_OPTIONS)
        return dict(config)
    config["OPTIONS"] = {"connect_timeout": 5}
    if pool_max:
        # The backend checks each pooled connection itself (pandaweb/core/postgresql/base.py):
        # the pool's own check waits seconds between broken connections.
        config["ENGINE"] = "pandaweb.core.postgresql"
        config["CONN_HEALTH_CHECKS"] = False
        config["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": pool_max,
            "timeout": pool_timeout,
            # Connections opened for a burst are closed a minute after it, down to one.
            "max_idle": 60,
        }
    return dict(config)


def redis_url(name: str) -> str:
    url = env_str(name)
    if url and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name}={url!r} is not a Redis URL (redis://host:port/db)")
    return url


DATA_DIR = Path(env_str("PANDAWEB_DATA_DIR", str(BASE_DIR / "var")))


def local_file(name: str, variable: str) -> Path:
    """A file the entry points create in DATA_DIR (pandaweb/localfiles.py); read, never written,
    here."""
    path = DATA_DIR / name
    if not path.is_file():
        raise ImproperlyConfigured(
            f"{path} is missing: run any manage.py command once (it creates it), or set {variable}"
        )
    return path


DEBUG = env_bool("PANDAWEB_DEBUG", False)
SECRET_KEY = env_str("PANDAWEB_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG and env_bool("PANDAWEB_REQUIRE_SECRET_KEY", False):
        raise ImproperlyConfigured("PANDAWEB_SECRET_KEY must be set")
    # Embedded default: a per-installation key kept beside the data (pandaweb/localfiles.py).
    key_file = local_file(SECRET_KEY_FILE, "PANDAWEB_SECRET_KEY")
    SECRET_KEY = key_file.read_text().strip()


def credential_keys() -> list[str]:
    """Fernet keys for credentials, newest first: from the environment, or from the file the entry
    points create (pandaweb/localfiles.py).

    ``PANDAWEB_CREDENTIAL_KEYS`` is a comma-separated list; the first key encrypts, all decrypt.
    """
    keys = env_list("PANDAWEB_CREDENTIAL_KEYS", [])
    if not keys:
        key_file = local_file(CREDENTIAL_KEYS_FILE, "PANDAWEB_CREDENTIAL_KEYS")
        keys = [line.strip() for line in key_file.read_text().splitlines() if line.strip()]
    for position, key in enumerate(keys, start=1):
        try:
            check_key(key)
        except ValueError as exc:
            # Name the position, never the key itself.
            raise ImproperlyConfigured(
                f"PANDAWEB_CREDENTIAL_KEYS: key {position} is {exc}"
            ) from None
    return keys


CREDENTIAL_KEYS = credential_keys()


ALLOWED_HOSTS = env_list("PANDAWEB_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("PANDAWEB_CSRF_TRUSTED_ORIGINS", [])


def env_origins(name: str, default: list[str]) -> list[str]:
    """A comma-separated list of origins (``https://host[:port]``, nothing after it)."""
    origins = env_list(name, default)
    for origin in origins:
        try:
            parts = urlsplit(origin)
            parts.port  # noqa: B018 (raises ValueError on a bad port)
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin like https://pandaweb.example.com"
            )
    return origins


# The port the dashboard serves on: `manage.py up --port` hands it to the daphne it starts.
PORT = env_int("PANDAWEB_PORT", 8000, minimum=1)
# Where browsers load the dashboard from, exactly (scheme, host and port): websockets from any
# other origin are refused. Behind a TLS proxy this is the public origin; by default the local
# addresses on PORT and every CSRF-trusted origin (the public origin, when one is configured).
PUBLIC_ORIGINS = env_origins(
    "PANDAWEB_PUBLIC_ORIGINS",
    [
        f"http://127.0.0.1:{PORT}",
        f"http://localhost:{PORT}",
        f"http://[::1]:{PORT}",
        *env_origins("PANDAWEB_CSRF_TRUSTED_ORIGINS", []),
    ],
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "template_partials",
    "pandaweb.core",
    "pandaweb.audit",
    "pandaweb.demo_portal",
    "workflows",
    "sessions.apps.RunSessionsConfig",
    "approvals",
    "pandaweb.webhooks",
    "pandaweb.schedules",
    "pandaweb.assist",
    # Serves its docs page's scripts and styles from our own static files (no CDN).
    "ninja",
    # The OAuth 2.0 authorization server of machine identities (client credentials only).
    "oauth2_provider",
    "pandaweb.api",
    "pandaweb.reviewers",
    "pandaweb.sso",
    "pandaweb.teams",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "pandaweb.core.security.ContentSecurityPolicyMiddleware",
    "pandaweb.core.security.RequestSizeLimitMiddleware",
    "pandaweb.audit.context.AuditRequestMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before anything reads the database: no free connection is a 503, not a 500.
    "pandaweb.core.database.DatabaseAvailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    # After authentication: a single sign-on session past its recheck time asks the provider.
    "pandaweb.sso.middleware.SsoRecheckMiddleware",
    # Last, as django-axes requires: it turns a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "pandaweb.urls"

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
                "pandaweb.core.context_processors.navigation",
            ],
        },
    },
]

WSGI_APPLICATION = None
ASGI_APPLICATION = "pandaweb.asgi.application"

_database_url = env_str("DATABASE_URL")
if _database_url:
    DATABASES = {
        "default": database_from_url(
            "DATABASE_URL",
            _database_url,
            pool_max=env_int("PANDAWEB_DB_POOL_MAX", 10, minimum=0),
            pool_timeout=env_int("PANDAWEB_DB_POOL_TIMEOUT", 10, minimum=1),
        )
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "pandaweb.sqlite3",
            "OPTIONS": dict(SQLITE_OPTIONS),
            # Tests use a file too: run threads, heartbeats and writers share it the way they do
            # in production (an in-memory database locks whole tables and never waits).
            "TEST": {"NAME": DATA_DIR / "test-pandaweb.sqlite3"},
        }
    }

REDIS_URL = redis_url("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py 8 reads with a 5 s socket timeout by default, as long as the blocking
                # pop channels_redis waits on: consumers then die with "Timeout reading from"
                # (redis/redis-py#4091). Reads may take longer than the pop, never forever.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "prefix": "pandaweb:channels",
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Where run work executes: "thread" (in the server process, the embedded default) or "celery"
# (separate worker processes, needs a broker). The default follows REDIS_URL.
RUN_EXECUTION = env_choice(
    "PANDAWEB_RUN_EXECUTION", "celery" if REDIS_URL else "thread", ("thread", "celery")
)
if RUN_EXECUTION == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("PANDAWEB_RUN_EXECUTION=celery needs REDIS_URL for the broker")
RUN_THREADS = env_int("PANDAWEB_RUN_THREADS", 4, minimum=1)

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Separate installations (or test runs) sharing one Redis must not take each other's tasks.
CELERY_TASK_DEFAULT_QUEUE = env_str("PANDAWEB_CELERY_QUEUE", "pandaweb")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Failed logins are counted per username and client address; after the limit that pair is locked
# out for the cool-off time. The login form is the front door to accounts that move money.
# Passwords are checked by a backend that refuses them when PANDAWEB_LOCAL_PASSWORDS is off
# (except for the break-glass administrator), on every form that signs in, the admin's included.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "pandaweb.sso.backends.LocalPasswordBackend",
]
AXES_FAILURE_LIMIT = env_int("PANDAWEB_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("PANDAWEB_LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False


def oidc_settings() -> OidcSettings | None:
    """Single sign-on with an OpenID Connect provider: on when PANDAWEB_OIDC_ISSUER is set."""
    issuer = env_str("PANDAWEB_OIDC_ISSUER").rstrip("/")
    if not issuer:
        return None
    if urlsplit(issuer).scheme not in ("http", "https") or not urlsplit(issuer).hostname:
        raise ImproperlyConfigured(
            f"PANDAWEB_OIDC_ISSUER={issuer!r} is not a URL like https://idp.example.com/realms/x"
        )
    missing = [
        name
        for name in ("PANDAWEB_OIDC_CLIENT_ID", "PANDAWEB_OIDC_CLIENT_SECRET")
        if not env_str(name)
    ]
    if missing:
        raise ImproperlyConfigured(
            f"PANDAWEB_OIDC_ISSUER is set, so {' and '.join(missing)} must be too"
        )
    try:
        role_map = parse_role_map(env_str("PANDAWEB_OIDC_ROLE_MAP"))
    except ValueError as error:
        raise ImproperlyConfigured(f"PANDAWEB_OIDC_ROLE_MAP: {error}") from None
    if not role_map:
        raise ImproperlyConfigured(
            "PANDAWEB_OIDC_ROLE_MAP must map at least one group to a role "
            "(e.g. pandaweb-operators=operators): nobody could sign in otherwise"
        )
    scopes = env_str("PANDAWEB_OIDC_SCOPES", "openid email profile")
    if "openid" not in scopes.split():
        raise ImproperlyConfigured(f"PANDAWEB_OIDC_SCOPES={scopes!r} must include openid")
    return OidcSettings(
        issuer=issuer,
        client_id=env_str("PANDAWEB_OIDC_CLIENT_ID"),
        client_secret=env_str("PANDAWEB_OIDC_CLIENT_SECRET"),
        discovery_url=env_str(
            "PANDAWEB_OIDC_DISCOVERY_URL", f"{issuer}/.well-known/openid-configuration"
        ),
        scopes=scopes,
        groups_claim=env_str("PANDAWEB_OIDC_GROUPS_CLAIM", "groups"),
        username_claim=env_str("PANDAWEB_OIDC_USERNAME_CLAIM", "preferred_username"),
        label=env_str("PANDAWEB_OIDC_LABEL", "single sign-on"),
        recheck_seconds=env_int("PANDAWEB_OIDC_RECHECK_SECONDS", 900, minimum=30),
        role_map=role_map,
    )


OIDC = oidc_settings()
# Off: only the break-glass administrator (a username) signs in with a password; everyone else
# through the identity provider.
LOCAL_PASSWORDS = env_bool("PANDAWEB_LOCAL_PASSWORDS", True)
BREAK_GLASS_ADMIN = env_str("PANDAWEB_BREAK_GLASS_ADMIN")
if not LOCAL_PASSWORDS and OIDC is None:
    raise ImproperlyConfigured(
        "PANDAWEB_LOCAL_PASSWORDS=off needs single sign-on (PANDAWEB_OIDC_ISSUER): "
        "nobody but the break-glass administrator could sign in"
    )

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# Production sits behind a TLS proxy: PANDAWEB_HTTPS turns on what that needs (secure cookies,
# redirect to https, HSTS). The proxy must say which requests arrived over TLS, in a header it
# always sets itself (PANDAWEB_PROXY_SSL_HEADER, e.g. X-Forwarded-Proto): trusted otherwise, a
# client could claim https.
HTTPS = env_bool("PANDAWEB_HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("PANDAWEB_SECURE_COOKIES", HTTPS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("PANDAWEB_SSL_REDIRECT", HTTPS)
SECURE_HSTS_SECONDS = env_int("PANDAWEB_HSTS_SECONDS", 31_536_000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PANDAWEB_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = env_bool("PANDAWEB_HSTS_PRELOAD", False)
_proxy_ssl_header = env_str("PANDAWEB_PROXY_SSL_HEADER")
if _proxy_ssl_header:
    if not all(ch.isalnum() or ch == "-" for ch in _proxy_ssl_header):
        raise ImproperlyConfigured(
            f"PANDAWEB_PROXY_SSL_HEADER={_proxy_ssl_header!r} is not a header name "
            "(e.g. X-Forwarded-Proto)"
        )
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")
# Asking browsers to ship the domain in their preload lists is the domain owner's decision
# (PANDAWEB_HSTS_PRELOAD), not a deployment defect: check --deploy does not warn about it.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
CSRF_FAILURE_VIEW = "pandaweb.core.security.csrf_failure"
# Largest request body accepted, files included (a workflow file may be 1 MB); larger ones get
# a page saying so. Django's own limit on form fields follows it.
MAX_REQUEST_BYTES = env_int("PANDAWEB_MAX_REQUEST_BYTES", 2_500_000, minimum=1_100_000)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("PANDAWEB_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Only needed for collectstatic behind a separate web server; WhiteNoise serves from the finders.
STATIC_ROOT = env_str("PANDAWEB_STATIC_ROOT") or None
# Served by WhiteNoise from the app itself: the dashboard works offline, with no CDN and no
# separate web server in the embedded default.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

EMAIL_BACKEND = env_str("PANDAWEB_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")

# Where runs execute their browsers: "local" (a system Chromium per run, in its own namespaces
# where the kernel allows), "microvm" (a QEMU microVM per run; needs `scripts/setup-microvm`) or
# "pandastack" (a remote PandaStack sandbox; docs/sandboxes-pandastack.md).
SANDBOX_BACKEND = env_choice(
    "PANDAWEB_SANDBOX_BACKEND", "local", ("local", "microvm", "pandastack")
)
# What the sandbox backends and the browser need (the sandbox directory, the Chromium, the
# namespaces, the microVMs, PandaStack): handed to the engine, which reads no environment.
ENGINE_CONFIG = engine_config()
# Screenshots, observations and downloads of runs; served only through permission checks.
RUN_FILES_DIR = Path(env_str("PANDAWEB_RUN_FILES_DIR", str(DATA_DIR / "runs")))
# Scratch sessions (authoring on a live page): how many browsers they may hold at once in the
# whole installation, and how long one lives.
SCRATCH_SESSIONS_MAX = env_int("PANDAWEB_SCRATCH_SESSIONS_MAX", 4, minimum=1)
SCRATCH_SESSION_MINUTES = env_int("PANDAWEB_SCRATCH_SESSION_MINUTES", 15, minimum=1)
# A run whose worker has not reported for this long is marked interrupted by the reaper.
RUN_HEARTBEAT_TIMEOUT_SECONDS = env_int("PANDAWEB_RUN_HEARTBEAT_TIMEOUT", 60, minimum=2)
# Every worker looks after its host's sandboxes this often: reaps expired ones, adopts runs no
# worker executes (waiting for a person, or approved and queued), fails those whose browser died.
HOUSEKEEPING_SECONDS = env_int("PANDAWEB_HOUSEKEEPING_SECONDS", 30, minimum=1)
# Embedded default: the process serving the ASGI application is also the worker: it keeps a warm
# browser driver and runs the housekeeping above (Celery beat's work in scale-out mode). A process
# that imports the application without serving runs (the test suite, which drives that work
# itself) turns this off.
EMBEDDED_WORKER = env_bool("PANDAWEB_EMBEDDED_WORKER", True)
# Live view: the most frames a second any viewer gets, and how long a controller's lost
# connection keeps control before the browser is handed back to the runner.
LIVE_MAX_FPS = env_int("PANDAWEB_LIVE_MAX_FPS", 5, minimum=1)
CONTROL_LOST_SECONDS = env_int("PANDAWEB_CONTROL_LOST_SECONDS", 20, minimum=1)
# A queued run, or an approved continuation, whose message was not taken within this long (a
# killed worker had prefetched it) is sent again; the database is the queue of record.
RUN_REDISPATCH_AFTER_SECONDS = env_int("PANDAWEB_RUN_REDISPATCH_AFTER", 45, minimum=1)
# Requests per minute each API token may make (sliding window; in Redis when REDIS_URL is set).
API_RATE_LIMIT_PER_MINUTE = env_int("PANDAWEB_API_RATE_LIMIT", 600, minimum=1)
# Machine identities (docs/api.md): OAuth 2.0 client credentials at /oauth/token/. Access tokens
# are short-lived, so a leaked one is worth minutes; the client asks again with its secret.
OAUTH_ACCESS_TOKEN_SECONDS = env_int("PANDAWEB_OAUTH_ACCESS_TOKEN_SECONDS", 600, minimum=60)
# The library's own application model, named so migrations can depend on it (it is swappable).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER = {
    "ACCESS_TOKEN_EXPIRE_SECONDS": OAUTH_ACCESS_TOKEN_SECONDS,
    "ACCESS_TOKEN_GENERATOR": "pandaweb.api.oauth.access_token_new",
    "OAUTH2_VALIDATOR_CLASS": "pandaweb.api.oauth.ClientCredentialsValidator",
    "SCOPES_BACKEND_CLASS": "pandaweb.api.oauth.ClientScopes",
    # Only the SHA-256 of an access token is stored, as for API tokens (RFC 9700, 4.14).
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    # The token endpoint serves the client credentials grant alone; the rest of the security
    # practice (RFC 9700) is switched on too, so no grant or transport it advises against is
    # ever reachable, and `check --deploy` has nothing to warn about.
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["https"],
}
# Run files (screenshots, observations, downloads) of runs that ended more than this many days ago
# are deleted by housekeeping; 0 keeps them forever. Database rows, their hashes and the audit
# trail are never pruned.
RUN_FILES_RETENTION_DAYS = env_int("PANDAWEB_RUN_FILES_RETENTION_DAYS", 0, minimum=0)
CELERY_BEAT_SCHEDULE = {
    "reap-silent-runs": {"task": "runs.reap", "schedule": 30.0},
    "prune-run-files": {"task": "runs.prune_files", "schedule": 3600.0},
    "rebake-session-templates": {"task": "runs.rebake_session_templates", "schedule": 300.0},
    "deliver-webhooks": {"task": "webhooks.drain", "schedule": 10.0},
    "fire-schedules": {"task": "schedules.tick", "schedule": 15.0},
}

# Signed checkpoints of the audit chain's head (pandaweb/audit/checkpoints.py): a directory the
# database's administrators cannot write, how often, and who gets each one by e-mail.
AUDIT_CHECKPOINT_DIR = Path(
    env_str("PANDAWEB_AUDIT_CHECKPOINT_DIR", str(DATA_DIR / "audit-checkpoints"))
)
AUDIT_CHECKPOINT_INTERVAL_SECONDS = env_int("PANDAWEB_AUDIT_CHECKPOINT_INTERVAL", 900, minimum=10)
AUDIT_CHECKPOINT_EMAILS = env_list("PANDAWEB_AUDIT_CHECKPOINT_EMAILS", [])
# The fingerprint (`manage.py audit_public_key`) exports and checkpoints must be signed with when
# verified here; empty: this installation's own key.
AUDIT_PUBLIC_KEY_FINGERPRINT = env_str("PANDAWEB_AUDIT_PUBLIC_KEY_FINGERPRINT")
if AUDIT_PUBLIC_KEY_FINGERPRINT and not all(
    ch in "0123456789abcdefABCDEF " for ch in AUDIT_PUBLIC_KEY_FINGERPRINT
):
    raise ImproperlyConfigured(
        f"PANDAWEB_AUDIT_PUBLIC_KEY_FINGERPRINT={AUDIT_PUBLIC_KEY_FINGERPRINT!r} is not a "
        "fingerprint like '3f2a 9c01 77be 0d4e' (see manage.py audit_public_key)"
    )
CELERY_BEAT_SCHEDULE["audit-checkpoint"] = {
    "task": "audit.checkpoint",
    "schedule": float(AUDIT_CHECKPOINT_INTERVAL_SECONDS),
}
# Webhooks: how long a receiver may take, how often one message is tried before it is given up,
# and after how many failed attempts in a row a subscription is switched off.
WEBHOOK_TIMEOUT_SECONDS = env_int("PANDAWEB_WEBHOOK_TIMEOUT", 10, minimum=1)
WEBHOOK_MAX_ATTEMPTS = env_int("PANDAWEB_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
# Where a launch's callback_url may point (host patterns as in a workflow's allowed_hosts: an
# administrator's list, since anyone who may launch names the address). Empty: callbacks are off.
CALLBACK_HOSTS = env_list("PANDAWEB_CALLBACK_HOSTS", [])
WEBHOOK_DISABLE_AFTER = env_int("PANDAWEB_WEBHOOK_DISABLE_AFTER", 15, minimum=1)
# Batch launch: the most rows one uploaded file may hold, and its largest size.
BATCH_MAX_ROWS = env_int("PANDAWEB_BATCH_MAX_ROWS", 1000, minimum=1)
BATCH_MAX_BYTES = env_int("PANDAWEB_BATCH_MAX_BYTES", 2_000_000, minimum=1000)

# Where people reach the dashboard; used in e-mails.
PANDAWEB_BASE_URL = env_str("PANDAWEB_BASE_URL", "http://127.0.0.1:8000").rstrip("/")

# Optional help from a language model (pandaweb/assist): an OpenAI-compatible endpoint, off when
# empty. It only ever proposes; a person decides.
ASSIST_URL = env_str("PANDAWEB_ASSIST_URL")
ASSIST_MODEL = env_str("PANDAWEB_ASSIST_MODEL", "default")
ASSIST_KEY = env_str("PANDAWEB_ASSIST_KEY")
if ASSIST_URL and urlsplit(ASSIST_URL).scheme not in ("http", "https"):
    raise ImproperlyConfigured(
        f"PANDAWEB_ASSIST_URL={ASSIST_URL!r} is not an http(s) address, e.g. "
        "http://127.0.0.1:11434/v1"
    )

# Chat approvals (Slack). Without a bot token no card is posted; without the signing secret every
# callback is refused. The API URL is configurable so tests can point it at a fake on loopback.
SLACK_BOT_TOKEN = env_str("PANDAWEB_SLACK_BOT_TOKEN")
SLACK_SIGNING_SECRET = env_str("PANDAWEB_SLACK_SIGNING_SECRET")
SLACK_API_URL = env_str("PANDAWEB_SLACK_API_URL", "https://slack.com/api/")
if not SLACK_API_URL.endswith("/"):
    SLACK_API_URL += "/"
# How long the signed link to a card's picture stays valid (Slack fetches it, maybe later).
SLACK_IMAGE_LINK_MINUTES = env_int("PANDAWEB_SLACK_IMAGE_LINK_MINUTES", 24 * 60, minimum=1)

# Passkeys: the relying party is the dashboard's host (PANDAWEB_BASE_URL) unless set.
PASSKEY_RP_ID = env_str("PANDAWEB_PASSKEY_RP_ID")
PASSKEY_RP_NAME = env_str("PANDAWEB_PASSKEY_RP_NAME", "pandaweb")


def vapid_private_key() -> str:
    """The Web Push (VAPID) private key, PEM: from the environment, or from the file the entry
    points create (pandaweb/localfiles.py)."""
    key = env_str("PANDAWEB_VAPID_PRIVATE_KEY")
    if key:
        return key.replace("\\n", "\n")
    return local_file(VAPID_KEY_FILE, "PANDAWEB_VAPID_PRIVATE_KEY").read_text()


VAPID_PRIVATE_KEY = vapid_private_key()
VAPID_SUBJECT = env_str("PANDAWEB_VAPID_SUBJECT", "mailto:pandaweb@localhost")
# Push services are public HTTPS endpoints; plain http (to a loopback fake) only when allowed.
WEB_PUSH_ALLOW_HTTP = env_bool("PANDAWEB_WEB_PUSH_ALLOW_HTTP", False)

DEMO_PORTAL_URL = env_str("PANDAWEB_DEMO_PORTAL_URL", "http://127.0.0.1:8001/")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"one_line_forbidden": {"()": "pandaweb.core.logfilters.OneLineForbidden"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["one_line_forbidden"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("PANDAWEB_LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}
