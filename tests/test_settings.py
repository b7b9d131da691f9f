"""semjobs.settings: what configures the service, and what may not."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import semjobs_cmd

SHOW_URL = [sys.executable, "-c", "from semjobs.settings import settings; print(settings.database_url)"]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMJOBS_")}
    return {**env, **extra}


def test_a_dotenv_in_the_working_directory_is_not_read_unless_named(tmp_path):
    """A `.env` that happens to sit where a command runs (a cloned repository, a shared folder)
    must not point the service at another database or make it import code."""
    (tmp_path / ".env").write_text("SEMJOBS_DATABASE_URL=sqlite:///elsewhere.sqlite\n"
                                   "SEMJOBS_ENGINE_FACTORY=os:system\n")
    shown = subprocess.run(SHOW_URL, cwd=tmp_path, env=_env(), capture_output=True, text=True, check=True)
    assert "elsewhere" not in shown.stdout
    named = subprocess.run(SHOW_URL, cwd=tmp_path, env=_env(SEMJOBS_ENV_FILE=".env"), capture_output=True,
                           text=True, check=True)
    assert named.stdout.strip() == "sqlite:///elsewhere.sqlite"


def test_a_named_env_file_that_is_missing_is_an_error_not_silence(tmp_path):
    done = subprocess.run([*semjobs_cmd(), "jobs", "--db", f"sqlite:///{tmp_path}/x.sqlite"], cwd=tmp_path,
                          env=_env(SEMJOBS_ENV_FILE="nowhere.env"), capture_output=True, text=True)
    assert done.returncode != 0
    assert "SEMJOBS_ENV_FILE names nowhere.env, which is not a file" in done.stderr + done.stdout
