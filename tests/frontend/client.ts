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
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (!data.length) continue; // a comment (keep-alive) or the retry hint
      const payload: unknown = JSON.parse(data.join("\n"));
      if (event === "stage") onStage(payload as StageEvent);
      else if (event === "response") return payload as Answer;
      else if (event === "error") throw new Error((payload as StreamError).detail);
    }
  }
  throw new Error("the stream ended without a response");
}
