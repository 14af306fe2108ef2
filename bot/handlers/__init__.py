"""One feature per module; `bot.app.build_application` registers them in order."""
