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

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

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


# Run threads and the web server share one file: wait for the write lock instead of failing at
# once, take it at BEGIN (the audit chain relies on that to serialize writers), and let readers
# proceed while one writer works.
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def database_from_url(name: str, url: str) -> dict[str, Any]:
    """Parse a database URL, turning the library's varied exceptions into one readable error."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in {"postgres", "postgresql", "pgsql", "sqlite"}:
        raise ImproperlyConfigured(
            f"{name}={url!r} is not a database URL: expected "
            "postgresql://user:password@host:port/dbname or sqlite:///path/to/db.sqlite3"
        )
    try:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except Exception as exc:  # the library raises ValueError, KeyError or its own types
        raise ImproperlyConfigured(f"{name}={url!r} could not be parsed: {exc}") from None
    config["OPTIONS"] = {"connect_timeout": 5} if scheme != "sqlite" else dict(SQLITE_OPTIONS)
    return dict(config)


def redis_url(name: str) -> str:
    url = env_str(name)
    if url and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name}={url!r} is not a Redis URL (redis://host:port/db)")
    return url


DATA_DIR = Path(env_str("PANDAWEB_DATA_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("PANDAWEB_DEBUG", False)
SECRET_KEY = env_str("PANDAWEB_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG and env_bool("PANDAWEB_REQUIRE_SECRET_KEY", False):
        raise ImproperlyConfigured("PANDAWEB_SECRET_KEY must be set")
    # Embedded default: a per-installation key kept beside the data, so sessions survive restarts
    # without anyone having to invent a secret on day one.
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        from django.core.management.utils import get_random_secret_key

        key_file.write_text(get_random_secret_key())
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()


def credential_keys() -> list[str]:
    """Fernet keys for credentials, newest first: from the environment, or generated once.

    ``PANDAWEB_CREDENTIAL_KEYS`` is a comma-separated list; the first key encrypts, all decrypt.
    """
    from workflows.vault import check_key, generate_key

    keys = env_list("PANDAWEB_CREDENTIAL_KEYS", [])
    if not keys:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key_file = DATA_DIR / "credential_keys"
        if not key_file.exists():
            key_file.write_text(generate_key() + "\n")
            key_file.chmod(0o600)
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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "pandaweb.audit.context.AuditRequestMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
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
    DATABASES = {"default": database_from_url("DATABASE_URL", _database_url)}
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
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
# Every worker also consumes its own queue ("<node>.dq2"): a run waiting for approval continues
# on the worker that holds its browser and egress proxy.
CELERY_WORKER_DIRECT = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Failed logins are counted per username and client address; after the limit that pair is locked
# out for the cool-off time. The login form is the front door to accounts that move money.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("PANDAWEB_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("PANDAWEB_LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("PANDAWEB_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
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
# The backends read these themselves (they run without Django); checked here so that a typo
# fails at start-up rather than at the first run.
LOCAL_NAMESPACES = env_choice("PANDAWEB_LOCAL_NAMESPACES", "auto", ("auto", "on", "off"))
MICROVM_ACCELERATOR = env_choice("PANDAWEB_MICROVM_ACCEL", "auto", ("auto", "kvm", "tcg"))
MICROVM_MEMORY_MIB = env_int("PANDAWEB_MICROVM_MEMORY_MIB", 1024, minimum=256)
MICROVM_POOL = env_int("PANDAWEB_MICROVM_POOL", 0, minimum=0)
# Screenshots, observations and downloads of runs; served only through permission checks.
RUN_FILES_DIR = Path(env_str("PANDAWEB_RUN_FILES_DIR", str(DATA_DIR / "runs")))
# A run whose worker has not reported for this long is marked interrupted by the reaper.
RUN_HEARTBEAT_TIMEOUT_SECONDS = env_int("PANDAWEB_RUN_HEARTBEAT_TIMEOUT", 60, minimum=10)
CELERY_BEAT_SCHEDULE = {
    "reap-silent-runs": {"task": "runs.reap", "schedule": 30.0},
    "rebake-session-templates": {"task": "runs.rebake_session_templates", "schedule": 300.0},
}

# Where people reach the dashboard; used in e-mails.
PANDAWEB_BASE_URL = env_str("PANDAWEB_BASE_URL", "http://127.0.0.1:8000").rstrip("/")

DEMO_PORTAL_URL = env_str("PANDAWEB_DEMO_PORTAL_URL", "http://127.0.0.1:8001/")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("PANDAWEB_LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}
