"""wrap(app): the six traced stages around an existing LangChain chain or LangGraph graph.

The app is left unchanged and is inspected once: its prompt templates give the prompt version
(a stable hash of their text), its chat model gives the model version and temperature, its
retriever is found so the retrieve stage can call it once. The caller's input is passed to the
app as it is; the question, the answer and the documents are found in the app's input and output
by ``_io`` (``input_key=``, ``output_key=``, ``documents_key=``). Each request runs:

- register: versions from the arguments or the inspection; those still unknown (prompt and
  model called inside graph nodes) are left to be learned from this request's runs;
- retrieve: the app's retriever (or ``retriever=``), called once with relevance scores where it
  can give them; an app that retrieves only inside its runs is recorded after them
  (``tracerag.retrieval.source = runs``);
- sample: the app run N times concurrently and independently (``_runs``);
  ``_capture`` records per run the documents it retrieved, the documents its output
  carries, its model calls and its prompt templates; documents a run retrieved that the retrieve
  stage did not join the materials after the retrieved ones, so what was in a prompt can be
  cited; deterministic errors (``_retryable``) are not retried. Versions left to the
  runs are learned here, and the request is refused if the runs do not show them either.
  A foreign app writes no plan, so each sample carries its *implied* plan — the materials it
  actually cited and the quantities it states;
- plan, verify and assemble: the stage table of RAGPipeline with ``plan="inline"`` (the plan
  stage records how far the samples' plans agree). Citations may be material ids
  (``[policy-7]``) or 1-based positions in the documents the run put in its prompt (``[1]``).

Only retrieval and sampling are wrap's own (``_source``); every stage is the shared one.

If the model runs at temperature 0 the samples cannot disagree: a warning is logged and put on
the span and the Response, and self-consistency is reported as uninformative.
"""

from tracerag.wrap._app import WrappedChain, wrap
from tracerag.wrap._runs import RUN_ONCE_METADATA, SAMPLING_MODES, Sampling

__all__ = ["RUN_ONCE_METADATA", "SAMPLING_MODES", "Sampling", "WrappedChain", "wrap"]
