"""A stand-in for Telegram: the Bot API answered by respx, and updates as Telegram sends them.

python-telegram-bot's real `Application`, `Bot` and httpx request layer run unchanged; only the
HTTP answers are ours. PTB posts Bot API calls as form fields, with complex values (keyboards,
prices) as JSON strings, so `calls()` decodes those and leaves scalars as strings; a call that
uploads a file (sendDocument) comes as multipart, and its file is kept as bytes.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import html
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import httpx
import respx
from telegram import Update
from telegram.ext import Application

BOT_ID = 7_000_000_001
BOT_USERNAME = "tokenshop_test_bot"
BOT_TOKEN = f"{BOT_ID}:AAE-tokenshop-test-token-never-logged-42"
API_HOST = "telegram.test"
API_BASE_URL = f"https://{API_HOST}/bot"

_update_ids = itertools.count(1)
_message_ids = itertools.count(1000)


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    result: Any = None  # what Telegram answered (a sent message, with its message_id)

    def __getitem__(self, name: str) -> Any:
        return self.params[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)


@dataclass
class FakeTelegram:
    """Records every Bot API call and answers it the way Telegram would."""

    calls_made: list[Call] = field(default_factory=list)
    waiters: dict[str, asyncio.Event] = field(default_factory=dict)
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)
    timeouts: set[str] = field(default_factory=set)  # methods whose answer never arrives
    star_transactions: list[dict[str, Any]] = field(default_factory=list)

    router: respx.MockRouter | None = None

    def install(self, router: respx.MockRouter) -> None:
        self.router = router
        router.route(host=API_HOST).mock(side_effect=self._answer)

    # What the bot did.
    def calls(self, method: str) -> list[Call]:
        return [call for call in self.calls_made if call.method == method]

    def last(self, method: str) -> Call:
        calls = self.calls(method)
        assert calls, f"the bot never called {method}"
        return calls[-1]

    def texts_to(self, chat_id: int) -> list[str]:
        """Every text the bot sent or edited into this chat, in order."""
        return [
            call["text"]
            for call in self.calls_made
            if call.method in ("sendMessage", "editMessageText")
            and int(call.get("chat_id", 0)) == chat_id
        ]

    def last_text_to(self, chat_id: int) -> str:
        texts = self.texts_to(chat_id)
        assert texts, f"the bot sent nothing to {chat_id}"
        return texts[-1]

    def called(self, method: str) -> asyncio.Event:
        """An event set when the bot next calls `method`: a way to wait without sleeping."""
        return self.waiters.setdefault(method, asyncio.Event())

    def sent_to(self, chat_id: int) -> list[Call]:
        """Every message the bot sent into this chat (its answer carries the message id)."""
        return [
            call
            for call in self.calls_made
            if call.method == "sendMessage" and int(call.get("chat_id", 0)) == chat_id
        ]

    def forget(self) -> None:
        self.calls_made.clear()

    def time_out(self, method: str) -> None:
        """Telegram does the work of every later `method` call, but the answer is lost."""
        self.timeouts.add(method)

    def fail(self, method: str, description: str, status: int = 400) -> None:
        """Make every later call of `method` fail as Telegram reports errors."""
        self.failures[method] = (status, description)

    # How Telegram answers.
    def _answer(self, request: httpx.Request) -> httpx.Response:
        method = request.url.path.rsplit("/", 1)[-1]
        assert BOT_TOKEN in request.url.path, "every Bot API call carries the token in its path"
        params = _params(request)
        call = Call(method, params)
        self.calls_made.append(call)
        if method in self.waiters:
            self.waiters.pop(method).set()
        if method in self.failures:
            status, description = self.failures[method]
            return httpx.Response(
                status, json={"ok": False, "error_code": status, "description": description}
            )
        call.result = self._result(method, params)
        if method in self.timeouts:
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return httpx.Response(200, json={"ok": True, "result": call.result})

    def _result(self, method: str, params: dict[str, Any]) -> Any:
        if method == "getMe":
            return bot_user()
        if method in ("sendMessage", "sendInvoice", "editMessageText", "sendDocument"):
            chat_id = int(params["chat_id"])
            return {
                "message_id": int(params.get("message_id") or next(_message_ids)),
                "date": int(time.time()),
                "chat": {"id": chat_id, "type": "private"},
                "from": bot_user(),
                "text": params.get("text", params.get("title", "")),
            }
        if method == "createInvoiceLink":  # what Telegram.WebApp.openInvoice takes
            return f"https://t.me/$invoice-{next(_message_ids)}"
        if method == "getStarTransactions":
            offset = int(params.get("offset") or 0)
            limit = int(params.get("limit") or 100)
            return {"transactions": self.star_transactions[offset : offset + limit]}
        return True


def _decode(value: str) -> Any:
    return json.loads(value) if value[:1] in "[{" else value


def _params(request: httpx.Request) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/"):
        return {name: _decode(value) for name, value in parse_qsl(request.content.decode())}
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + request.content)
    params: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if part.get_filename():
            params[str(name)] = {"filename": part.get_filename(), "content": payload}
        else:
            params[str(name)] = _decode(payload.decode())
    return params


def _member(status: str) -> dict[str, Any]:
    """The bot as a member of a private chat ("kicked": the user blocked it)."""
    return {"user": bot_user(), "status": status} | (
        {"until_date": 0} if status == "kicked" else {}
    )


def _plain(text: str) -> str:
    """A message's text as a Telegram client receives it: the HTML parsed away."""
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def bot_user() -> dict[str, Any]:
    return {"id": BOT_ID, "is_bot": True, "first_name": "Tokenshop", "username": BOT_USERNAME}


@dataclass
class TelegramUser:
    """A person talking to the bot in a private chat; sends updates the way Telegram delivers
    them, and waits for the bot to finish handling each one."""

    application: Application  # type: ignore[type-arg]
    id: int
    first_name: str = "Alice"
    language_code: str = "en"
    queued: bool = False  # hand updates to the running application's queue, as polling does

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "is_bot": False,
            "first_name": self.first_name,
            "language_code": self.language_code,
        }

    async def deliver(self, update: dict[str, Any]) -> None:
        parsed = Update.de_json({"update_id": next(_update_ids), **update}, self.application.bot)
        if self.queued:
            await self.application.update_queue.put(parsed)
        else:
            await self.application.process_update(parsed)

    def _message(self, **content: Any) -> dict[str, Any]:
        return {
            "message_id": next(_message_ids),
            "date": int(time.time()),
            "chat": {"id": self.id, "type": "private", "first_name": self.first_name},
            "from": self.as_dict(),
            **content,
        }

    async def send(self, text: str, reply_to: Call | None = None) -> None:
        """Send a text; with `reply_to`, as a reply to that message of the bot."""
        content: dict[str, Any] = {"text": text}
        if text.startswith("/"):
            command = text.split()[0]
            content["entities"] = [{"type": "bot_command", "offset": 0, "length": len(command)}]
        if reply_to is not None:
            content["reply_to_message"] = {
                "message_id": reply_to.result["message_id"],
                "date": int(time.time()),
                "chat": {"id": self.id, "type": "private"},
                "from": bot_user(),
                "text": _plain(reply_to["text"]),
            }
        await self.deliver({"message": self._message(**content)})

    async def block(self, blocked: bool = True) -> None:
        """Block (or unblock) the bot: Telegram sends a my_chat_member update."""
        statuses = ("member", "kicked") if blocked else ("kicked", "member")
        await self.deliver(
            {
                "my_chat_member": {
                    "chat": {"id": self.id, "type": "private", "first_name": self.first_name},
                    "from": self.as_dict(),
                    "date": int(time.time()),
                    "old_chat_member": _member(statuses[0]),
                    "new_chat_member": _member(statuses[1]),
                }
            }
        )

    async def tap(self, data: str, message_id: int = 1) -> None:
        """Tap an inline button whose callback data is `data`."""
        await self.deliver(
            {
                "callback_query": {
                    "id": str(next(_update_ids)),
                    "from": self.as_dict(),
                    "chat_instance": f"ci-{self.id}",
                    "data": data,
                    "message": {
                        "message_id": message_id,
                        "date": int(time.time()),
                        "chat": {"id": self.id, "type": "private"},
                        "from": bot_user(),
                        "text": "…",
                    },
                }
            }
        )

    async def pre_checkout(self, payload: str, amount: int, currency: str = "XTR") -> None:
        await self.deliver(
            {
                "pre_checkout_query": {
                    "id": f"pcq-{next(_update_ids)}",
                    "from": self.as_dict(),
                    "currency": currency,
                    "total_amount": amount,
                    "invoice_payload": payload,
                }
            }
        )

    async def paid(
        self,
        payload: str,
        amount: int,
        charge_id: str,
        *,
        renews_at: int | None = None,
        first: bool = False,
    ) -> None:
        """Telegram's service message for a successful payment; with `renews_at` (Unix time),
        a subscription's charge: its first (`first`) or a renewal."""
        payment: dict[str, Any] = {
            "currency": "XTR",
            "total_amount": amount,
            "invoice_payload": payload,
            "telegram_payment_charge_id": charge_id,
            "provider_payment_charge_id": "",
        }
        if renews_at is not None:
            payment |= {"subscription_expiration_date": renews_at, "is_recurring": True}
            if first:
                payment["is_first_recurring"] = True
        await self.deliver({"message": self._message(successful_payment=payment)})

    async def refunded(self, payload: str, amount: int, charge_id: str) -> None:
        """Telegram's service message for a refunded payment."""
        await self.deliver(
            {
                "message": self._message(
                    refunded_payment={
                        "currency": "XTR",
                        "total_amount": amount,
                        "invoice_payload": payload,
                        "telegram_payment_charge_id": charge_id,
                    }
                )
            }
        )


def star_payment(
    charge_id: str,
    user: TelegramUser,
    amount: int,
    payload: str,
    *,
    date: int | None = None,
    subscription_period: int | None = None,
) -> dict[str, Any]:
    """An incoming Star transaction as getStarTransactions lists it (a subscription's charge
    carries its period)."""
    source: dict[str, Any] = {
        "type": "user",
        "transaction_type": "invoice_payment",
        "user": user.as_dict(),
        "invoice_payload": payload,
    }
    if subscription_period is not None:
        source["subscription_period"] = subscription_period
    return {
        "id": charge_id,
        "amount": amount,
        "date": int(time.time()) if date is None else date,
        "source": source,
    }


def star_refund(charge_id: str, user: TelegramUser, amount: int) -> dict[str, Any]:
    return {
        "id": charge_id,
        "amount": amount,
        "date": int(time.time()),
        "receiver": {"type": "user", "transaction_type": "invoice_payment", "user": user.as_dict()},
    }
