"""The one `tokenshop` command, assembled from the commands billing, the API and the bot
contribute: it lists all of them, in the order the operator knows."""

from __future__ import annotations

COMMANDS = [
    "serve",
    "bot",
    "export-model",
    "migrate",
    "grant",
    "balance",
    "audit",
    "sweep",
    "packs",
    "keys",
    "strays",
    "promo",
]


def test_help_lists_every_packages_commands_in_order(tokenshop):
    for args in (("--help",), ()):  # no arguments shows the help too
        result = tokenshop(*args)
        assert result.returncode == 0, result.stderr
        listed = result.stdout.split("Commands:\n", 1)[1].splitlines()
        assert [line.split()[0] for line in listed] == COMMANDS
        assert "  serve         Serve the OpenAI-compatible API.\n" in result.stdout


def test_an_unknown_command_gives_one_line_and_exit_2(tokenshop):
    result = tokenshop("frobnicate")
    assert result.returncode == 2
    assert result.stderr == "tokenshop: error: No such command 'frobnicate'.\n"
