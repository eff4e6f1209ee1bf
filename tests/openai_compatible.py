"""An OpenAI-compatible chat completions server on 127.0.0.1 for the tests: it answers with the
extractive demo model and returns ``n`` choices per call, billing the prompt once (the usage an
OpenAI-compatible provider reports: ``prompt_tokens`` once, ``completion_tokens`` of all the
choices). Every request body it received is kept, in order."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from tracerag._usage import estimate_tokens
from tracerag.demo.models.extractive import ExtractiveChatModel


def _messages(body: dict[str, Any]) -> list[BaseMessage]:
    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [
        kinds.get(m.get("role"), HumanMessage)(content=m.get("content") or "")
        for m in body["messages"]
    ]


class CompletionsServer:
    """``with CompletionsServer.running() as server``: ``server.base_url`` (…/v1), ``bodies``."""

    def __init__(self, seed: int = 1) -> None:
        self.model = ExtractiveChatModel(seed=seed)
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        n = int(body.get("n") or 1)
        messages = _messages(body)
        temperature = float(body.get("temperature", 0.7))
        with self._lock:
            self.bodies.append(body)
            texts = [self.model.respond(messages, temperature) for _ in range(n)]
        prompt = sum(estimate_tokens(str(m.content)) for m in messages)
        completion = sum(estimate_tokens(t) for t in texts)
        return {
            "id": f"chatcmpl-{len(self.bodies)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "extractive"),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
                for i, text in enumerate(texts)
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    @classmethod
    @contextmanager
    def running(cls, seed: int = 1) -> Iterator[CompletionsServer]:
        server = cls(seed)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self.send_error(404)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                data = json.dumps(server.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server._httpd = httpd
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)
