"""One module per language: `NAME` and `TEXTS` (see `bot.texts`)."""
