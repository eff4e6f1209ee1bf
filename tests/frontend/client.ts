// A typed client of the tracerag answer API. Every type comes from generated/api.d.ts, which
// openapi-typescript makes from the server's own /v1/openapi.json: nothing here is hand-written.
import type { components, paths } from "./generated/api";

export type AnswerRequest = components["schemas"]["AnswerRequest"];
export type Answer =
  paths["/v1/answer"]["post"]["responses"][200]["content"]["application/json"];
export type RequestStatus =
  paths["/v1/requests/{request_id}"]["get"]["responses"][200]["content"]["application/json"];
export type StageEvent = components["schemas"]["StageEvent"];
export type StreamError = components["schemas"]["StreamError"];
export type Problem = components["schemas"]["Problem"];
export type ErrorCode = Problem["error"];
/** One event of an answer stream: a union told apart by `event`. */
export type StreamEvent = components["schemas"]["StreamEvent"];
export type EventName = StreamEvent["event"];
export type EventsTicket = components["schemas"]["EventsTicket"];
export type Decision = Extract<StreamEvent, { event: "decision" }>["data"];

export class ApiError extends Error {
  constructor(public status: number, public problem: Problem) {
    super(`${status} ${problem.error}`);
  }
}

function headers(apiKey?: string): Record<string, string> {
  const h: Record<string, string> = { "Content-Type": "application/json" };
  if (apiKey) h["X-API-Key"] = apiKey;
  return h;
}

async function failed(reply: Response): Promise<never> {
  throw new ApiError(reply.status, (await reply.json()) as Problem);
}

export async function ask(base: string, body: AnswerRequest, apiKey?: string): Promise<Answer> {
  const reply = await fetch(`${base}/v1/answer`, {
    method: "POST",
    headers: headers(apiKey),
    body: JSON.stringify(body),
  });
  if (!reply.ok) return failed(reply);
  return (await reply.json()) as Answer;
}

export async function outcome(base: string, requestId: string, apiKey?: string): Promise<RequestStatus> {
  const reply = await fetch(`${base}/v1/requests/${encodeURIComponent(requestId)}`, {
    headers: apiKey ? { "X-API-Key": apiKey } : {},
  });
  if (!reply.ok) return failed(reply);
  return (await reply.json()) as RequestStatus;
}

/** Turn one SSE block into a typed event (null for comments and the retry hint). */
export function parseBlock(block: string): StreamEvent | null {
  let event = "";
  let id = "";
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) event = line.slice(7);
    else if (line.startsWith("id: ")) id = line.slice(4);
    else if (line.startsWith("data: ")) data.push(line.slice(6));
  }
  if (!data.length) return null; // a comment (keep-alive) or the retry hint
  return { event, id, data: JSON.parse(data.join("\n")) } as StreamEvent;
}

/** Ask with the SSE stream: `onStage` sees each stage; resolves with the final Response. */
export async function askStreaming(
  base: string,
  body: AnswerRequest,
  onStage: (event: StageEvent) => void,
  apiKey?: string,
): Promise<Answer> {
  const reply = await fetch(`${base}/v1/answer/stream`, {
    method: "POST",
    headers: headers(apiKey),
    body: JSON.stringify(body),
  });
  if (!reply.ok || !reply.body) return failed(reply);
  const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const message = parseBlock(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (message === null) continue;
      switch (message.event) {
        case "stage":
          onStage(message.data);
          break;
        case "response":
          return message.data;
        case "error":
          throw new Error(`${message.data.error}: ${message.data.detail}`);
        case "decision":
          break; // only streams asked to wait for it send one
      }
    }
  }
  throw new Error("the stream ended without a response");
}

/** Start a request (a backend holding the key does this); the ticket's events_url is for a page. */
export async function start(
  base: string,
  body: AnswerRequest,
  apiKey?: string,
  idempotencyKey?: string,
): Promise<EventsTicket> {
  const h = headers(apiKey);
  if (idempotencyKey) h["Idempotency-Key"] = idempotencyKey;
  const reply = await fetch(`${base}/v1/requests`, { method: "POST", headers: h, body: JSON.stringify(body) });
  if (reply.status !== 202) return failed(reply);
  return (await reply.json()) as EventsTicket;
}

const EVENT_NAMES: readonly EventName[] = ["stage", "response", "error", "decision"];

/** Follow a request's events with EventSource; `onEvent` sees each, typed by its name. */
export function follow(eventsUrl: string, onEvent: (event: StreamEvent) => void): EventSource {
  const source = new EventSource(eventsUrl);
  for (const name of EVENT_NAMES) {
    source.addEventListener(name, (m: MessageEvent<string>) => {
      onEvent({ event: name, id: m.lastEventId, data: JSON.parse(m.data) } as StreamEvent);
    });
  }
  return source;
}

/** True when the event ends what a caller waits for: an error, a decision, or a response
 * no reviewer will decide. */
export function ends(event: StreamEvent): boolean {
  switch (event.event) {
    case "error":
    case "decision":
      return true;
    case "response":
      return !(event.data.decision !== "pass" && event.data.audit_persisted !== false);
    case "stage":
      return false;
  }
}
