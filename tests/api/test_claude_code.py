"""Claude Code itself (npm's `@anthropic-ai/claude-code`, run by npm's `node@22`) against the real
server on a Tokenshop key, as the README tells a user to run it.

Both are installed from npm on first use into `.cache/claude-code` (`npm install --prefix`), so a
clean clone needs nothing by hand. The demo model's text is noise: what is checked is that a
session runs without an API error, that its second turn starts from the prefix cache, and that
the account is billed exactly the usage Claude Code reports.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from billing.models import LedgerEntry
from tests.api.conftest import ROOT, LiveServer

pytestmark = pytest.mark.slow

PACKAGES = ("node@22", "@anthropic-ai/claude-code@2.1.197")
PREFIX = ROOT / ".cache" / "claude-code"


@pytest.fixture(scope="session")
def claude_code() -> Path:
    """The `claude` executable, installed with the Node it needs on first use (one installer at
    a time across pytest-xdist workers)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed to install Claude Code (apt: npm)")
    PREFIX.mkdir(parents=True, exist_ok=True)
    claude = PREFIX / "node_modules" / ".bin" / "claude"
    with open(PREFIX / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not claude.exists():
            subprocess.run(
                [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", *PACKAGES],
                check=True,
                timeout=600,
            )
    return claude


def run_claude(
    claude: Path, server: LiveServer, key: str, home: Path, *args: str
) -> dict[str, Any]:
    """`claude -p ... --output-format json` as a user runs it, in a home of its own. Answers
    are capped at 32 tokens (`CLAUDE_CODE_MAX_OUTPUT_TOKENS`): the random demo model seldom
    ends a turn by itself, and Claude Code asks it to go on a few times before it gives up."""
    node_bin = PREFIX / "node_modules" / "node" / "bin"
    env = {
        "PATH": f"{node_bin}:{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server.base_url.removesuffix("/v1"),
        "ANTHROPIC_AUTH_TOKEN": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32",
    }
    done = subprocess.run(
        [str(claude), *args, "--output-format", "json", "--model", "demo"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.stdout, done.stderr[-2000:]
    return json.loads(done.stdout)


def ended_without_an_api_error(result: dict[str, Any]) -> bool:
    """Done, or Claude Code's own ending for answers that keep hitting their token cap."""
    if result["api_error_status"] is not None:
        return False
    return not result["is_error"] or "output token maximum" in result["result"]


def usage_entries(engine: Any) -> list[LedgerEntry]:
    with Session(engine) as session:
        query = select(LedgerEntry).where(LedgerEntry.kind == "usage").order_by(col(LedgerEntry.id))
        return list(session.exec(query))


def assert_billed_as_reported(entries: list[LedgerEntry], usage: dict[str, Any]) -> None:
    """Claude Code sums the usage of every request of a turn; the ledger has one entry each."""
    prompt = sum(entry.prompt_tokens for entry in entries)
    completion = sum(entry.completion_tokens for entry in entries)
    reported = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    assert (prompt, completion) == (reported, usage["output_tokens"])
    assert -sum(entry.amount for entry in entries) == prompt + completion  # the default price


def test_a_claude_code_session_runs_billed_and_its_next_turn_starts_from_the_cache(
    claude_code, server, api_key, engine, tmp_path
):
    first = run_claude(claude_code, server, api_key, tmp_path, "-p", "Say hello.")
    assert ended_without_an_api_error(first), first["result"]
    before = usage_entries(engine)
    assert before and before[0].prompt_tokens > 30_000  # its system prompt and tools, whole
    assert_billed_as_reported(before, first["usage"])

    second = run_claude(claude_code, server, api_key, tmp_path, "--continue", "-p", "Again.")
    assert ended_without_an_api_error(second), second["result"]
    usage = second["usage"]
    read, computed = usage["cache_read_input_tokens"], usage["input_tokens"]
    assert read >= 0.9 * (read + computed)
    assert_billed_as_reported(usage_entries(engine)[len(before) :], usage)
