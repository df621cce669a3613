"""The engine is configured by the ``EngineConfig`` handed in, never by the environment."""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

import pytest

from sessions.engine.chromium import find_chromium
from sessions.engine.config import EngineConfig
from sessions.engine.sandbox.backends import get_backend
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.sandbox.microvm.backend import MicroVMBackend
from sessions.engine.sandbox.pandastack import PandaStackBackend

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "sessions" / "engine"

# What an operator may have exported: none of it may reach a backend that was handed a config.
ENVIRONMENT = {
    "PANDAWEB_SANDBOX_DIR": "/from/the/environment/sandboxes",
    "PANDAWEB_CHROMIUM": "/from/the/environment/chromium",
    "PANDAWEB_LOCAL_NAMESPACES": "on",
    "PANDAWEB_MICROVM_IMAGE_DIR": "/from/the/environment/images",
    "PANDAWEB_MICROVM_ACCEL": "kvm",
    "PANDAWEB_MICROVM_MEMORY_MIB": "4096",
    "PANDAWEB_MICROVM_POOL": "3",
    "PANDAWEB_PANDASTACK_TEMPLATE": "from-the-environment",
    "PANDASTACK_API": "http://environment.invalid",
    "PANDASTACK_API_KEY": "key-from-the-environment",
}


@pytest.fixture
def config(tmp_path: Path) -> EngineConfig:
    return EngineConfig(
        sandbox_dir=tmp_path / "sandboxes",
        chromium=sys.executable,  # an executable file, which is all find_chromium checks
        local_namespaces="off",
        microvm_image_dir=tmp_path / "images",
        microvm_accelerator="tcg",
        microvm_memory_mib=512,
        microvm_pool=0,
        pandastack_template="from-the-config",
        pandastack_api="http://config.invalid",
        pandastack_api_key="key-from-the-config",
    )


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("environment")
def test_the_local_backend_takes_the_config_over_the_environment(config: EngineConfig) -> None:
    backend = get_backend("local", config)
    assert isinstance(backend, LocalBackend)
    assert backend.root == config.sandbox_dir
    assert backend.namespaces == "off"
    assert backend.chromium == sys.executable


@pytest.mark.usefixtures("environment")
def test_the_chromium_is_the_configured_one_or_the_systems(config: EngineConfig) -> None:
    assert find_chromium(config.chromium) == sys.executable
    # Unconfigured, it is looked for on PATH; the environment's nonexistent path is not read
    # (it would raise FileNotFoundError).
    assert find_chromium("") != ENVIRONMENT["PANDAWEB_CHROMIUM"]


@pytest.mark.usefixtures("environment")
def test_the_microvm_backend_takes_the_config_over_the_environment(config: EngineConfig) -> None:
    backend = get_backend("microvm", config)
    assert isinstance(backend, MicroVMBackend)
    assert backend.root == config.sandbox_dir
    assert backend.images == config.microvm_image_dir
    assert backend.accelerator_setting == "tcg"
    assert backend.memory_mib == 512
    assert backend.pool_size == 0


@pytest.mark.usefixtures("environment")
def test_the_pandastack_backend_takes_the_config_over_the_environment(
    config: EngineConfig,
) -> None:
    pytest.importorskip("pandastack")
    backend = get_backend("pandastack", config)
    assert isinstance(backend, PandaStackBackend)
    assert backend.template == "from-the-config"
    client = backend._client()
    assert client.api_url == "http://config.invalid"
    assert client.api_key == "key-from-the-config"


def test_the_defaults_are_the_products() -> None:
    config = EngineConfig()
    assert config.sandbox_dir == Path(tempfile.gettempdir()) / "pandaweb-sandboxes"
    assert config.chromium == ""
    assert config.local_namespaces == "auto"
    assert config.microvm_image_dir == ROOT / "var" / "microvm"
    assert config.microvm_accelerator == "auto"
    assert config.microvm_memory_mib == 1024
    assert config.microvm_pool == 0
    assert config.pandastack_template == "browser"


def test_the_api_key_stays_out_of_the_configs_repr() -> None:
    assert "secret-key" not in repr(EngineConfig(pandastack_api_key="secret-key"))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("local_namespaces", "sometimes", "local_namespaces must be one of auto, on, off"),
        ("microvm_accelerator", "hvf", "microvm_accelerator must be one of auto, kvm, tcg"),
        ("microvm_memory_mib", 128, "below the minimum of 256"),
        ("microvm_pool", -1, "negative"),
        ("microvm_image_dir", Path("var/images"), "must be an absolute path"),
    ],
)
def test_it_refuses_a_setting_no_backend_can_honour(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read a setting from the environment: ``os.getenv(...)``,
    ``os.environ.get(...)`` or ``os.environ["NAME"]``. Copying variables into a child's
    environment by a name held in a variable (PATH, LANG, TZ) is not configuration."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            getenv = node.func.attr == "getenv"
            environ_get = node.func.attr == "get" and is_environ(node.func.value)
            if getenv or environ_get:
                found.append(node.lineno)
        if (
            isinstance(node, ast.Subscript)
            and is_environ(node.value)
            and isinstance(node.slice, ast.Constant)
        ):
            found.append(node.lineno)
    return found


def test_the_scan_sees_every_way_of_reading_a_setting() -> None:
    code = 'os.getenv("A")\nos.environ.get("B")\nos.environ["C"]\nos.environ[name]\n'
    assert environment_reads(ast.parse(code)) == [1, 2, 3]


def test_no_engine_module_reads_its_settings_from_the_environment() -> None:
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(ENGINE.rglob("*.py"))
        if (lines := environment_reads(ast.parse(path.read_text(), str(path))))
    }
    assert offenders == {}
