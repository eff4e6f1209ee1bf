// The frontend page on another origin: asks the API (JSON and stream) and shows the results.
import { ApiError, ask, askStreaming, outcome, type StageEvent } from "./client.js";

const params = new URLSearchParams(location.search);
const base = params.get("api") ?? "";
const question = params.get("q") ?? "";
const out = document.getElementById("out") as HTMLPreElement;

async function main(): Promise<void> {
  const answer = await ask(base, { question, channel: "web" });
  const stages: StageEvent["stage"][] = [];
  const streamed = await askStreaming(base, { question }, (e) => stages.push(e.stage));
  const polled = await outcome(base, answer.request_id);
  let refused = "";
  try {
    await ask(base, { question: "\u200b" });
  } catch (e) {
    refused = e instanceof ApiError ? `${e.status} ${e.problem.error}` : String(e);
  }
  out.textContent = JSON.stringify({
    answer,
    stages,
    streamed,
    polled,
    refused,
  });
}

main()
  .catch((e: unknown) => {
    out.textContent = JSON.stringify({ failure: String(e) });
  })
  .finally(() => {
    document.body.dataset.done = "1";
  });
