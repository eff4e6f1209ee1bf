// tracerag-stream.js: read a tracerag answer stream with fetch, and resume it when it drops.
//
// Served by `tracerag serve` at /v1/client/tracerag-stream.js (copy it into your app if you
// prefer). For a page, EventSource on the events URL of POST /v1/requests needs no helper;
// this one is for code that POSTs the question itself and may send headers (a backend, a
// trusted app, the API without a key):
//
//   import { streamAnswer } from "https://api.example.com/v1/client/tracerag-stream.js";
//   const last = await streamAnswer("https://api.example.com", { question: "发票怎么开？" }, {
//     headers: { "X-API-Key": key },    // never put the key in a page your users load
//     onEvent: (e) => console.log(e.event, e.id, e.data),
//     untilDecision: true,              // keep going until a reviewer decides (if routed)
//   });
//   // last: the final event, {event: "response" | "error" | "decision", id, data}
//
// When the connection drops it asks again with the same Idempotency-Key and the last event's
// id as Last-Event-ID: the server resumes the same request after that event; nothing is asked
// twice and no event is seen twice. Errors the server sends (4xx) are thrown as
// TraceragStreamError with the server's {error, detail}.

/** An error response of the server, or a stream that could not be resumed. */
export class TraceragStreamError extends Error {
  /**
   * @param {number} status HTTP status (0 when the server could not be reached)
   * @param {{error: string, detail: unknown}} problem the server's error body
   */
  constructor(status, problem) {
    super(`${status} ${problem.error}: ${typeof problem.detail === "string" ? problem.detail : JSON.stringify(problem.detail)}`);
    this.name = "TraceragStreamError";
    this.status = status;
    this.problem = problem;
  }
}

/**
 * Parse Server-Sent Events from a text stream, calling `onBlock` with each event.
 * @param {ReadableStreamDefaultReader<string>} reader
 * @param {(block: {event: string, id: string | null, data: string | null, retry: number | null}) => boolean | void} onBlock return true to stop reading
 */
export async function readEvents(reader, onBlock) {
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      let id = null;
      let retry = null;
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // a comment: the greeting or a keep-alive ping
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "event") event = text;
        else if (field === "id") id = text;
        else if (field === "data") data.push(text);
        else if (field === "retry" && /^\d+$/.test(text)) retry = Number(text);
      }
      if (onBlock({ event, id, data: data.length ? data.join("\n") : null, retry }) === true) {
        await reader.cancel();
        return;
      }
    }
  }
}

/**
 * Ask a question on POST /v1/answer/stream and follow it to its end, resuming after drops.
 *
 * @param {string} base the API's origin, e.g. "https://api.example.com"
 * @param {{question: string, session_id?: string, user_id?: string, channel?: string}} body
 * @param {{
 *   headers?: Record<string, string>,
 *   onEvent?: (event: {event: string, id: string, data: any}) => void,
 *   untilDecision?: boolean,
 *   idempotencyKey?: string,
 *   retries?: number,
 *   signal?: AbortSignal,
 * }} [options]
 * @returns {Promise<{event: string, id: string, data: any}>} the final event
 */
export async function streamAnswer(base, body, options = {}) {
  const key = options.idempotencyKey ?? crypto.randomUUID();
  const url = `${base.replace(/\/$/, "")}/v1/answer/stream${options.untilDecision ? "?until=decision" : ""}`;
  const retries = options.retries ?? 5;
  let waitMs = 3000;
  /** @type {string | null} */
  let lastId = null;
  /** @type {{event: string, id: string, data: any} | null} */
  let last = null;
  for (let attempt = 0; ; attempt++) {
    /** @type {Record<string, string>} */
    const headers = { "Content-Type": "application/json", "Idempotency-Key": key, ...(options.headers ?? {}) };
    if (lastId) headers["Last-Event-ID"] = lastId;
    let finished = false;
    try {
      const reply = await fetch(url, { method: "POST", headers, body: JSON.stringify(body), signal: options.signal });
      if (reply.status === 204) {
        if (last) return last; // everything was sent already
        throw new TraceragStreamError(204, { error: "request_unfinished", detail: "the stream had nothing to send" });
      }
      if (!reply.ok || !reply.body) {
        const problem = await reply.json().catch(() => ({ error: "error", detail: reply.statusText }));
        throw new TraceragStreamError(reply.status, problem);
      }
      await readEvents(reply.body.pipeThrough(new TextDecoderStream()).getReader(), (block) => {
        if (block.retry !== null) waitMs = block.retry;
        if (block.data === null || block.id === null) return;
        const event = { event: block.event, id: block.id, data: JSON.parse(block.data) };
        lastId = block.id;
        last = event;
        options.onEvent?.(event);
        const end = event.event === "error" || event.event === "decision" ||
          (event.event === "response" && !(options.untilDecision && awaitsDecision(event.data)));
        if (end) finished = true;
        return end;
      });
      if (finished && last) return last;
    } catch (e) {
      if (e instanceof TraceragStreamError && e.status >= 400 && e.status < 500) throw e;
      if (options.signal?.aborted) throw e;
      if (attempt >= retries) throw e;
    }
    if (attempt >= retries) {
      throw new TraceragStreamError(0, { error: "request_unfinished", detail: "the stream kept dropping" });
    }
    await new Promise((resolve) => setTimeout(resolve, waitMs));
  }
}

/** True when a response will be followed by a reviewer's decision. */
function awaitsDecision(response) {
  return (response.decision === "review" || response.decision === "escalate") && response.audit_persisted !== false;
}
