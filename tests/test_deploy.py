"""deploy/env.example lists every environment variable the settings (and the launcher, for the
web's command line) read, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _settings_variables() -> set[str]:
    source = "".join((REPO_ROOT / "inline_farm" / name).read_text()
                     for name in ("settings.py", "cli.py"))
    return set(re.findall(r"""env_\w+\(\s*["']([A-Z][A-Z0-9_]*)["']""", source))


def _example_variables() -> set[str]:
    text = (REPO_ROOT / "deploy" / "env.example").read_text()
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


def test_env_example_lists_every_variable_the_settings_read() -> None:
    assert _settings_variables() - _example_variables() == set()


def test_env_example_lists_no_variable_the_settings_ignore() -> None:
    assert _example_variables() - _settings_variables() == set()
