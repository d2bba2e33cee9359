"""stlib._versions: one jax floor (pyproject.toml declares the same), and ``import stlib`` refuses an
older jax in one sentence before it imports jax."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stlib._versions import JAX_FLOOR, check_jax, installed_jax

REPO = Path(__file__).resolve().parents[1]
JAX_REQUIREMENT = re.compile(r"^jax(\[tpu\])?\s*>=\s*(?P<floor>[\d.]+)\s*;\s*(?P<marker>.+)$")


def jax_requirements(lines) -> dict[str, str]:
    """{environment marker: floor} of the jax requirements among ``lines``."""
    found = {}
    for line in lines:
        if re.match(r"jax\b", line):
            match = JAX_REQUIREMENT.match(line.strip())
            assert match, f"{line!r}: a jax requirement is 'jax[tpu]>=X; marker' or 'jax>=X; marker'"
            found[re.sub(r"\s+", " ", match["marker"].replace('"', "'"))] = match["floor"]
    return found


def test_pyproject_declares_the_floor_of_stlib_versions():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert jax_requirements(dependencies) == {
        "sys_platform == 'linux'": JAX_FLOOR,
        "sys_platform != 'linux'": JAX_FLOOR,
    }
    assert "tqdm" in dependencies


def test_the_pinned_jax_is_above_the_floor():
    check_jax(installed_jax())  # the jax these tests run with
    pins = re.findall(r"^jax(?:\[tpu\])?==([\d.]+)", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert pins
    for pin in pins:
        check_jax(pin)


@pytest.mark.parametrize(
    "version", [JAX_FLOOR, f"{JAX_FLOOR}rc1", f"{JAX_FLOOR}.dev20260601", "0.11.0", "1.0"]
)
def test_the_floor_and_newer_pass(version):
    check_jax(version)


@pytest.mark.parametrize("version", ["0.10.0", "0.9.2", "0.4.38", "0.10"])
def test_an_older_jax_is_refused_in_one_sentence(version):
    with pytest.raises(ImportError) as info:
        check_jax(version)
    message = str(info.value)
    assert message.startswith(f"stlib needs jax >= {JAX_FLOOR} (jax {version} is installed): ")
    assert f'pip install -U "jax[tpu]>={JAX_FLOOR}"' in message and f'"jax>={JAX_FLOOR}"' in message
    assert message.endswith(".") and not re.search(r"[.!?]\s", message), "one sentence"


def test_no_jax_is_refused_too():
    with pytest.raises(ImportError, match=r"\(jax is not installed\)"):
        check_jax(None)


def test_import_stlib_refuses_an_older_jax_before_importing_it():
    """A fresh interpreter whose package metadata says jax 0.4.30 (jax itself stays installed)."""
    code = (
        "import sys\n"
        "from importlib import metadata\n"
        "real = metadata.version\n"
        "metadata.version = lambda name: '0.4.30' if name == 'jax' else real(name)\n"
        "try:\n"
        "    import stlib\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "    print('jax imported' if 'jax' in sys.modules else 'jax not imported')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    message, imported = proc.stdout.splitlines()
    assert message.startswith(f"stlib needs jax >= {JAX_FLOOR} (jax 0.4.30 is installed)")
    assert imported == "jax not imported"
