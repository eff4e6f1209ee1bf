// A trusted page using the server's fetch-stream helper (/v1/client/tracerag-stream.js): it
// POSTs the question with headers and resumes the stream when the connection drops.
import type { StreamEvent } from "./client.js";

type Helper = {
  streamAnswer(
    base: string,
    body: { question: string },
    options: {
      headers?: Record<string, string>;
      onEvent?: (event: StreamEvent) => void;
      untilDecision?: boolean;
      idempotencyKey?: string;
    },
  ): Promise<StreamEvent>;
};

const params = new URLSearchParams(location.search);
const api = params.get("api") ?? ""; // where the helper is served
const base = params.get("base") ?? api; // where the stream is asked (maybe through a proxy)
const out = document.getElementById("out") as HTMLPreElement;
const seen: StreamEvent[] = [];

async function main(): Promise<void> {
  const helper = (await import(`${api}/v1/client/tracerag-stream.js`)) as Helper;
  const last = await helper.streamAnswer(
    base,
    { question: params.get("q") ?? "" },
    {
      headers: { "X-API-Key": params.get("key") ?? "" },
      onEvent: (event) => seen.push(event),
      idempotencyKey: params.get("idem") ?? undefined,
    },
  );
  out.textContent = JSON.stringify({ seen, last });
}

main()
  .catch((e: unknown) => {
    out.textContent = JSON.stringify({ failure: String(e), seen });
  })
  .finally(() => {
    document.body.dataset.done = "1";
  });
