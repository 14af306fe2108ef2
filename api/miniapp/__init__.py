"""The Telegram Mini App: its static page (`static/`, served at /app), Telegram's `initData`
check and the page's sessions (`auth`), and the Bot API calls the API process makes for it
(`telegram`). Its JSON routes are `api/routes/miniapp.py`, their work `api/serving/miniapp.py`."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"  # index.html, app.js, app.css, vendor/
