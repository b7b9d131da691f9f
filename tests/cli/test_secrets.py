"""A database password never leaves the URL it was given in: not in command output, errors,
status JSON, reports, exports or the job's manifest. Real Postgres (trust auth: it accepts
any password, so a URL with one works)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from semjobs.cli.main import main
from tests.conftest import ROOT

SECRET = "s3cret-pw"


@pytest.mark.parametrize("given_as", ["userinfo", "query"])
def test_no_command_shows_the_database_password(pg_db, tmp_path, fake_engine, last_run_file, given_as):
    """Whether the password is the URL's own or libpq's ?password= parameter."""
    url = (make_url(pg_db).set(password=SECRET) if given_as == "userinfo"
           else make_url(pg_db).update_query_dict({"password": SECRET})).render_as_string(hide_password=False)
    runner = CliRunner()

    def invoke(*args):
        res = runner.invoke(main, [str(a) for a in args])
        assert SECRET not in res.output, (args, res.output)
        return res

    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "out.jsonl", "--db", url,
                 "--max-new-tokens", 8)
    assert res.exit_code == 0, res.output
    job_id = res.output.strip().splitlines()[-1]
    assert "***" in res.output  # the database it names, password masked
    for args in (["jobs", "--json"], ["status", job_id, "--json"], ["status", job_id],
                 ["export", job_id, "-o", tmp_path / "again.jsonl", "--format", "jsonl"],
                 ["report", job_id, "-o", tmp_path / "report"], ["status", "nope"]):
        invoke(*args, "--db", url)
    # a database that does not answer: the error names the host, not the password
    down = make_url(url).set(port=1).render_as_string(hide_password=False)
    res = invoke("status", "--db", down)
    assert res.exit_code == 1 and "cannot use the database" in res.output
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".md")
               and p != last_run_file]
    assert written and not [p for p in written if SECRET in p.read_text()]
    # nor the last-run record (a later command names a database with a password again)
    assert SECRET not in last_run_file.read_text()
    assert last_run_file.stat().st_mode & 0o077 == 0
    assert SECRET not in json.dumps(json.loads(invoke("status", job_id, "--json", "--db", url).output))
