// Run with node: sends one question with the generated client and prints what came back.
import { ask, askStreaming, outcome, type StageEvent } from "./client.js";

declare const process: { argv: string[]; exitCode?: number };

const [base, question] = process.argv.slice(2);
const answer = await ask(base, { question, channel: "node-check" });
const stages: StageEvent["stage"][] = [];
const streamed = await askStreaming(base, { question }, (e) => stages.push(e.stage));
const polled = await outcome(base, answer.request_id);
console.log(
  JSON.stringify({
    decision: answer.decision,
    answer: answer.answer,
    request_id: answer.request_id,
    stages,
    streamed_decision: streamed.decision,
    state: polled.state,
  }),
);
