"""How many reviewer-token guesses the desk checks per second, on this machine only.

The server (``create_app`` with a reviewer token, the desk on) runs under uvicorn on 127.0.0.1;
``--concurrency`` clients send wrong tokens as fast as they can, as Bearer headers or on the
sign-in form, for ``--seconds`` (at most 30). Reported: guesses the server checked (401), guesses
refused unchecked while the client was locked out (429), and checked guesses per second.

Usage: python benchmarks/desk_guessing.py [--concurrency 64] [--seconds 5] [--path bearer|form]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
TOKEN = "benchmark-reviewer-token-7Hq2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


async def guess(base: str, path: str, seconds: float, concurrency: int) -> dict[str, int]:
    import httpx

    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    async def one(client: httpx.AsyncClient, n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            wrong = f"wrong-guess-{n:03d}-{i:08d}"
            if path == "bearer":
                reply = await client.get(
                    f"{base}/review/api/queue", headers={"Authorization": f"Bearer {wrong}"}
                )
            else:
                reply = await client.post(
                    f"{base}/review/signin", data={"reviewer": "x", "token": wrong}
                )
            counts[str(reply.status_code)] = counts.get(str(reply.status_code), 0) + 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=10) as client:
        await asyncio.gather(*[one(client, n) for n in range(concurrency)])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--path", choices=["bearer", "form"], default="bearer")
    args = parser.parse_args()
    seconds = min(args.seconds, 30.0)

    import logging

    import uvicorn

    from tracerag.server._asgi import create_app
    from tracerag.store._sqlite import SQLiteAuditStore
    from tracerag.testing import ScriptedChatModel

    logging.getLogger("tracerag").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteAuditStore(str(Path(tmp) / "audit.sqlite"))
        from tracerag._pipeline import RAGPipeline
        from tracerag.demo.kb import build_retriever

        pipeline = RAGPipeline(
            build_retriever(k=4),
            ScriptedChatModel(),
            prompt_version="bench",
            model_version="scripted",
            audit=None,
        )
        app = create_app(pipeline, store, reviewer_token=TOKEN)
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host=HOST, port=port, log_level="error", access_log=False)
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        try:
            counts = asyncio.run(
                guess(f"http://{HOST}:{port}", args.path, seconds, args.concurrency)
            )
        finally:
            server.should_exit = True
            thread.join(10)
            store.close()
    checked = counts.get("401", 0)
    print(
        json.dumps(
            {
                "path": args.path,
                "concurrency": args.concurrency,
                "seconds": seconds,
                "replies": counts,
                "checked_guesses_per_s": round(checked / seconds, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
