"""wrap(app): the six traced stages around an existing agent, LangGraph graph or chain.

The app is left unchanged and is inspected once (``_inspect``): its prompt templates give the
prompt version, its chat model the model version and temperature, its retriever is found so the
retrieve stage can call it once, and the retrievers and vector stores it reaches from its nodes,
tools and middleware are instrumented (``_hooks``) so what they return is seen and, within a
request, shared. The caller's input is passed to the app as it is; the question (from any
message form LangChain accepts), the answer and the documents are found in the app's input and
output by ``_io``. Each request runs:

- register: versions from the arguments or the inspection; those still unknown are left to be
  learned from this request's runs (``_versions``: templates the runs formatted, else what
  reached the model), each with how it was obtained;
- retrieve: the app's retriever (or ``retriever=``), called once with relevance scores where it
  can give them; an app that retrieves only inside its runs is recorded after them
  (``tracerag.retrieval.source = runs``);
- sample (``_source``, ``_runs``): the app's own run, and N-1 more answers — with
  ``sampling="answer"`` forks of that run from its answering step (a graph's checkpoint before
  it, a chain's model step on the same input), with ``sampling="app"`` whole runs. ``_capture``
  records per run the documents it retrieved (retrievers, tool artifacts, store searches), the
  text its tools showed the model, its model calls and prompt templates; ``_materials`` makes
  the materials of them and each answer's order of what it was shown. Deterministic errors
  (``_retryable``) are not retried. An app writes no plan, so each sample carries its *implied*
  plan — the materials it actually cited and the quantities it states;
- plan, verify and assemble: the stage table of RAGPipeline with ``plan="inline"`` (the plan
  stage records how far the samples' plans agree). Citations may be material ids
  (``[policy-7]``) or 1-based positions in what the run's answering call was shown (``[1]``).
  When the app keeps its own run's answer (a checkpointed thread, run-once nodes), that answer
  is the one verified and returned.

Only retrieval and sampling are wrap's own; every stage is the shared one. If the model runs at
temperature 0 the samples cannot disagree: a warning is logged and put on the span and the
Response, and self-consistency is reported as uninformative.
"""

from tracerag.wrapping._app import WrappedChain, wrap
from tracerag.wrapping._samples import Sampling

__all__ = ["Sampling", "WrappedChain", "wrap"]
