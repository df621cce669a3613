from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from pandaweb.settings import (
    database_from_url,
    engine_config,
    env_bool,
    env_choice,
    env_int,
    redis_url,
)
from sessions.engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
# A well-formed Fernet key, used only to satisfy the settings in a subprocess.
FERNET_KEY = "A" * 43 + "="
VAPID_KEY = "-----BEGIN PRIVATE KEY-----\\nnot read at import\\n-----END PRIVATE KEY-----"


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_nonsense_database_url_is_one_readable_line() -> None:
    result = run_manage("check", DATABASE_URL="nonsense")

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "pandaweb: configuration error: DATABASE_URL='nonsense' is not a database URL: expected "
        "postgresql://user:password@host:port/dbname or sqlite:///path/to/db.sqlite3"
    ]
    assert "Traceback" not in result.stderr


def test_a_wrong_redis_url_is_refused_by_name() -> None:
    result = run_manage("check", REDIS_URL="http://localhost:6379")

    assert result.returncode == 2
    assert "REDIS_URL='http://localhost:6379' is not a Redis URL" in result.stderr


def test_celery_execution_without_a_broker_is_refused() -> None:
    result = run_manage("check", PANDAWEB_RUN_EXECUTION="celery")

    assert result.returncode == 2
    assert "PANDAWEB_RUN_EXECUTION=celery needs REDIS_URL" in result.stderr


def test_no_configuration_means_the_embedded_default() -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.CHANNEL_LAYERS['default']['BACKEND'], "
        "s.RUN_EXECUTION)"
    )
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "pandaweb.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "channels.layers.InMemoryChannelLayer",
        "thread",
    ]


def test_urls_switch_to_postgres_redis_and_celery() -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.DATABASES['default']['HOST'], "
        "s.CHANNEL_LAYERS['default']['BACKEND'], s.RUN_EXECUTION, s.CELERY_BROKER_URL)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "pandaweb.settings",
            "DATABASE_URL": "postgresql://app@db.example.test:5432/pandaweb",
            "REDIS_URL": "redis://cache.example.test:6379/2",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert result.stdout.split() == [
        "pandaweb.core.postgresql",
        "db.example.test",
        "channels_redis.core.RedisChannelLayer",
        "celery",
        "redis://cache.example.test:6379/2",
    ]


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("yes", True), ("off", False), ("False", False)]
)
def test_it_reads_booleans(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("PANDAWEB_FLAG", raw)

    assert env_bool("PANDAWEB_FLAG", not expected) is expected


def test_it_refuses_a_boolean_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDAWEB_FLAG", "maybe")

    with pytest.raises(ImproperlyConfigured, match=r"PANDAWEB_FLAG='maybe' is not a boolean"):
        env_bool("PANDAWEB_FLAG", False)


def test_it_refuses_integers_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDAWEB_THREADS", "0")

    with pytest.raises(ImproperlyConfigured, match="must be at least 1"):
        env_int("PANDAWEB_THREADS", 4, minimum=1)
    monkeypatch.setenv("PANDAWEB_THREADS", "four")
    with pytest.raises(ImproperlyConfigured, match="is not an integer"):
        env_int("PANDAWEB_THREADS", 4, minimum=1)


def test_it_refuses_an_unknown_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDAWEB_MODE", "fast")

    with pytest.raises(ImproperlyConfigured, match="must be one of: thread, celery"):
        env_choice("PANDAWEB_MODE", "thread", ("thread", "celery"))


ENGINE_VARIABLES = (
    "PANDAWEB_SANDBOX_DIR",
    "PANDAWEB_CHROMIUM",
    "PANDAWEB_LOCAL_NAMESPACES",
    "PANDAWEB_MICROVM_IMAGE_DIR",
    "PANDAWEB_MICROVM_ACCEL",
    "PANDAWEB_MICROVM_MEMORY_MIB",
    "PANDAWEB_MICROVM_POOL",
    "PANDAWEB_PANDASTACK_TEMPLATE",
    "PANDASTACK_API",
    "PANDASTACK_API_KEY",
)


def test_the_engine_gets_its_own_defaults_when_nothing_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    assert engine_config() == EngineConfig()


def test_the_engine_config_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PANDAWEB_SANDBOX_DIR", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("PANDAWEB_CHROMIUM", "/opt/chromium/chrome")
    monkeypatch.setenv("PANDAWEB_LOCAL_NAMESPACES", "off")
    monkeypatch.setenv("PANDAWEB_MICROVM_IMAGE_DIR", str(tmp_path / "images"))
    monkeypatch.setenv("PANDAWEB_MICROVM_ACCEL", "tcg")
    monkeypatch.setenv("PANDAWEB_MICROVM_MEMORY_MIB", "2048")
    monkeypatch.setenv("PANDAWEB_MICROVM_POOL", "2")
    monkeypatch.setenv("PANDAWEB_PANDASTACK_TEMPLATE", "chromium-large")
    monkeypatch.setenv("PANDASTACK_API", "http://localhost:8080")
    monkeypatch.setenv("PANDASTACK_API_KEY", "pds_key")

    assert engine_config() == EngineConfig(
        sandbox_dir=tmp_path / "sandboxes",
        chromium="/opt/chromium/chrome",
        local_namespaces="off",
        microvm_image_dir=tmp_path / "images",
        microvm_accelerator="tcg",
        microvm_memory_mib=2048,
        microvm_pool=2,
        pandastack_template="chromium-large",
        pandastack_api="http://localhost:8080",
        pandastack_api_key="pds_key",
    )


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("PANDAWEB_LOCAL_NAMESPACES", "sometimes", "must be one of: auto, on, off"),
        ("PANDAWEB_MICROVM_ACCEL", "hvf", "must be one of: auto, kvm, tcg"),
        ("PANDAWEB_MICROVM_MEMORY_MIB", "128", "must be at least 256"),
        ("PANDAWEB_MICROVM_POOL", "-1", "must be at least 0"),
        ("PANDAWEB_MICROVM_IMAGE_DIR", "var/images", "must be an absolute path"),
    ],
)
def test_a_bad_engine_setting_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, message: str
) -> None:
    monkeypatch.setenv(name, raw)

    with pytest.raises(ImproperlyConfigured, match=f"{name}='{raw}' {message}"):
        engine_config()


def test_it_parses_a_postgres_url_into_a_bounded_pool_with_a_connect_timeout() -> None:
    config = database_from_url(
        "DATABASE_URL", "postgres://u:p@127.0.0.1:5432/db", pool_max=7, pool_timeout=3
    )

    assert config["ENGINE"] == "pandaweb.core.postgresql"
    assert (config["NAME"], config["USER"], config["PORT"]) == ("db", "u", 5432)
    assert config["OPTIONS"] == {
        "connect_timeout": 5,
        "pool": {"min_size": 1, "max_size": 7, "timeout": 3, "max_idle": 60},
    }
    # A pool replaces persistent connections (Django refuses both); the backend, not the pool,
    # checks each connection handed out.
    assert (config["CONN_MAX_AGE"], config["CONN_HEALTH_CHECKS"]) == (0, False)


def test_a_pool_of_zero_means_a_connection_per_request_and_none_kept() -> None:
    config = database_from_url("DATABASE_URL", "postgres://u@127.0.0.1/db", pool_max=0)

    assert config["OPTIONS"] == {"connect_timeout": 5}
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["CONN_MAX_AGE"], config["CONN_HEALTH_CHECKS"]) == (0, True)


def settings_under(env: dict[str, str], expression: str) -> subprocess.CompletedProcess[str]:
    code = "import django; django.setup(); from django.conf import settings as s; "
    code += f"print({expression})"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "pandaweb.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_pool_is_sized_by_the_environment() -> None:
    result = settings_under(
        {
            "DATABASE_URL": "postgresql://app@db.example.test:5432/pandaweb",
            "PANDAWEB_DB_POOL_MAX": "4",
            "PANDAWEB_DB_POOL_TIMEOUT": "2",
        },
        "s.DATABASES['default']['OPTIONS']['pool']",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'min_size': 1, 'max_size': 4, 'timeout': 2, 'max_idle': 60}"


def test_a_negative_pool_size_is_refused_by_name() -> None:
    result = run_manage(
        "check", DATABASE_URL="postgresql://app@127.0.0.1/pandaweb", PANDAWEB_DB_POOL_MAX="-1"
    )

    assert result.returncode == 2
    assert "PANDAWEB_DB_POOL_MAX='-1' must be at least 0" in result.stderr


def test_it_refuses_a_mysql_url_it_does_not_support() -> None:
    with pytest.raises(ImproperlyConfigured, match="is not a database URL"):
        database_from_url("DATABASE_URL", "mysql://u@127.0.0.1/db")


def test_an_empty_redis_url_means_no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "")

    assert redis_url("REDIS_URL") == ""


def test_importing_the_settings_writes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PANDAWEB_", "DATABASE_URL"))}
    env |= {"PANDAWEB_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "pandaweb.settings"}
    keys = {
        "PANDAWEB_SECRET_KEY": "k" * 50,
        "PANDAWEB_CREDENTIAL_KEYS": FERNET_KEY,
        "PANDAWEB_VAPID_PRIVATE_KEY": VAPID_KEY,
    }

    imported = subprocess.run(
        [sys.executable, "-c", "import pandaweb.settings"],
        cwd=ROOT, env={**env, **keys}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    missing = subprocess.run(
        [sys.executable, "-c", "import pandaweb.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert imported.returncode == 0, imported.stderr
    assert not data_dir.exists()
    # Without the keys in the environment the files are the entry points' to make.
    assert f"{data_dir / 'secret_key'} is missing: run any manage.py command once" in (
        missing.stderr
    )
    assert not data_dir.exists()


def test_an_entry_point_makes_the_keys_once(tmp_path: Path) -> None:
    from pandaweb.localfiles import ensure_local_files

    environ = {"PANDAWEB_DATA_DIR": str(tmp_path / "data")}
    ensure_local_files(environ)
    first = (tmp_path / "data" / "secret_key").read_text()
    ensure_local_files(environ)

    assert (tmp_path / "data" / "secret_key").read_text() == first
    assert (tmp_path / "data" / "credential_keys").stat().st_mode & 0o777 == 0o600
