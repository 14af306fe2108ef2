"""The one `tokenshop` command, assembled from the commands billing, the API and the bot
contribute: it lists all of them, in the order the operator knows."""

from __future__ import annotations

COMMANDS = [
    ("serve", "Serve the OpenAI-compatible API."),
    ("bot", "Run the Telegram bot."),
    ("export-model", "Export a model to ONNX for serving (needs the `export`..."),
    ("migrate", "Bring the database schema up to date (alembic upgrade head)."),
    ("grant", "Give an account tokens."),
    ("balance", "Show an account's balance."),
    ("audit", "Check the books; exit 1 on any mismatch."),
    ("sweep", "Resolve holds past their expiry (the API also does this..."),
    ("packs", "List the catalog of token packs."),
    ("keys", "Issue, show, rotate and revoke API keys."),
]


def test_help_lists_every_packages_commands_in_order(tokenshop):
    for args in (("--help",), ()):  # no arguments shows the help too
        result = tokenshop(*args)
        assert result.returncode == 0, result.stderr
        listed = result.stdout.split("Commands:\n", 1)[1].splitlines()
        assert [line.split(None, 1) for line in listed] == [list(pair) for pair in COMMANDS]


def test_an_unknown_command_gives_one_line_and_exit_2(tokenshop):
    result = tokenshop("frobnicate")
    assert (result.returncode, result.stderr) == (
        2,
        "tokenshop: error: No such command 'frobnicate'.\n",
    )
