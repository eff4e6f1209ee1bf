"""The tests' OpenAI-compatible server (tests/openai_compatible.py), speaking tool calls too, so
a ``create_agent`` app with ``ChatOpenAI`` runs against it: bound to tools, the extractive demo
model first calls the agent's tool with the user's question, then answers from the tool's
results, ``n`` choices per call with the prompt billed once (``prompt_tokens`` once,
``completion_tokens`` of all the choices)."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from openai_compatible import CompletionsServer

from tracerag._usage import estimate_tokens


def _message(m: dict[str, Any]) -> BaseMessage:
    role, content = m.get("role"), m.get("content") or ""
    if role == "system":
        return SystemMessage(content=content)
    if role == "tool":
        return ToolMessage(content=content, tool_call_id=str(m.get("tool_call_id") or ""))
    if role == "assistant":
        calls = [
            {
                "name": c["function"]["name"],
                "args": json.loads(c["function"].get("arguments") or "{}"),
                "id": c.get("id"),
                "type": "tool_call",
            }
            for c in m.get("tool_calls") or []
        ]
        return AIMessage(content=content, tool_calls=calls)
    return HumanMessage(content=content)


def _choice(index: int, message: BaseMessage) -> dict[str, Any]:
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        return {
            "index": index,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                    }
                    for c in calls
                ],
            },
            "finish_reason": "tool_calls",
        }
    return {
        "index": index,
        "message": {"role": "assistant", "content": str(message.content)},
        "finish_reason": "stop",
    }


class ToolCompletionsServer(CompletionsServer):
    """``with ToolCompletionsServer.running() as server``: ``base_url``, ``bodies`` (in order)."""

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [_message(m) for m in body["messages"]]
        with self._lock:
            self.bodies.append(body)
            result = self.model._reply(
                messages,
                tools=body.get("tools") or (),
                n=int(body.get("n") or 1),
                temperature=float(body.get("temperature", 0.7)),
            )
        replies = [g.message for g in result.generations]
        prompt = sum(estimate_tokens(json.dumps(m, ensure_ascii=False)) for m in body["messages"])
        completion = sum(estimate_tokens(str(r.content) or "tool call") for r in replies)
        return {
            "id": f"chatcmpl-{len(self.bodies)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "extractive"),
            "choices": [_choice(i, r) for i, r in enumerate(replies)],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
