// A caller page: follows one request with EventSource (the events URL its backend gave it)
// and shows every event, the answer, and the reviewer's decision when one comes. It never
// polls: the only requests it makes are the EventSource's.
import { ends, follow, type StreamEvent } from "./client.js";

const params = new URLSearchParams(location.search);
const eventsUrl = params.get("events") ?? "";
const out = document.getElementById("out") as HTMLPreElement;
const state = document.getElementById("state") as HTMLParagraphElement;
const seen: StreamEvent[] = [];
let errors = 0;

const source = follow(eventsUrl, (event) => {
  seen.push(event);
  switch (event.event) {
    case "stage":
      state.textContent = `stage ${event.data.stage}`;
      break;
    case "response":
      state.textContent = event.data.answer ?? `withheld (${event.data.status})`;
      break;
    case "decision":
      state.textContent = `${event.data.state}: ${event.data.final_answer ?? "no answer"}`;
      break;
    case "error":
      state.textContent = `error ${event.data.error}`;
      break;
  }
  out.textContent = JSON.stringify({ seen, errors });
  document.body.dataset.last = event.event;
  if (ends(event)) {
    source.close();
    document.body.dataset.done = "1";
  }
});
source.onerror = () => {
  errors += 1; // a dropped connection: EventSource reconnects with Last-Event-ID
  out.textContent = JSON.stringify({ seen, errors });
};
