"""Why this answer, tier 3: offline experiments on a stored request (``tracerag explain``).

A stored request is re-run through the six stages with its recorded materials, parameters and
versions (refused on a version mismatch unless forced, as ``tracerag replay`` is), first as it
was (the baseline), then once per experiment:

- occlusion: each used material in turn is replaced by a placeholder of the same shape (same
  id, title and position in the prompt, neutral text). Recorded: whether the answer's
  conclusion changed, the confidence and route before and after, and which supported claims
  of the baseline answer lost their support;
- counterfactual: a value the answer took from a material (an amount, a date, a duration) is
  changed in that material (500元 → 800元). An answer that follows the new value uses its
  materials; one that keeps the old value answers from the model's prior, and is flagged;
- paraphrase (optional, needs a live retriever): the question lightly reworded is answered
  from a fresh retrieval. A different conclusion or different key materials mark the
  retrieval as unstable.

The number of model calls is known before any is made (runs × calls per run); it is printed,
and a plan above the cap is refused. The report is appended to the request's audit trail (an
``explanation`` entry, covered by the hash chain), and its spans form one trace whose root
links to the span that recorded the request's attribution.

Attribution by experiment is approximate: a masked material can be substituted by another
that says the same, and a model may change its answer for reasons unrelated to the material.


The work is in private modules, one concern each: ``_explain_plan`` (what to try and what
it costs), ``_explain_runs`` (the re-runs and their verdicts), ``_explain_render`` (the text)
and ``_explain_command`` (``tracerag explain``). This module is their public face.
"""

from __future__ import annotations

# The parts' names, importable from here as before (``X as X``: an explicit re-export; the
# documented ones are in __all__).
from tracerag.tools._explain_plan import (
    DEFAULT_MAX_CALLS as DEFAULT_MAX_CALLS,
)
from tracerag.tools._explain_plan import (
    FLAG_NO_DECISIVE as FLAG_NO_DECISIVE,
)
from tracerag.tools._explain_plan import (
    FLAG_PRIOR as FLAG_PRIOR,
)
from tracerag.tools._explain_plan import (
    FLAG_UNSTABLE as FLAG_UNSTABLE,
)
from tracerag.tools._explain_plan import (
    FOLLOWS as FOLLOWS,
)
from tracerag.tools._explain_plan import (
    IGNORES as IGNORES,
)
from tracerag.tools._explain_plan import (
    PLACEHOLDER as PLACEHOLDER,
)
from tracerag.tools._explain_plan import (
    TARGET_KINDS as TARGET_KINDS,
)
from tracerag.tools._explain_plan import (
    UNCLEAR as UNCLEAR,
)
from tracerag.tools._explain_plan import (
    CostTooHigh,
)
from tracerag.tools._explain_plan import (
    ExperimentPlan as ExperimentPlan,
)
from tracerag.tools._explain_plan import (
    Target as Target,
)
from tracerag.tools._explain_plan import (
    calls_per_run as calls_per_run,
)
from tracerag.tools._explain_plan import (
    counterfactual_text as counterfactual_text,
)
from tracerag.tools._explain_plan import (
    light_paraphrases as light_paraphrases,
)
from tracerag.tools._explain_plan import (
    plan_experiments as plan_experiments,
)
from tracerag.tools._explain_plan import (
    recorded_attribution as recorded_attribution,
)
from tracerag.tools._explain_render import (
    INDENT as INDENT,
)
from tracerag.tools._explain_render import (
    render_attribution as render_attribution,
)
from tracerag.tools._explain_render import (
    render_explanations as render_explanations,
)
from tracerag.tools._explain_render import (
    render_report as render_report,
)
from tracerag.tools._explain_runs import (
    Counterfactual as Counterfactual,
)
from tracerag.tools._explain_runs import (
    Explanation,
    explain,
)
from tracerag.tools._explain_runs import (
    Occlusion as Occlusion,
)
from tracerag.tools._explain_runs import (
    ParaphraseCheck as ParaphraseCheck,
)
from tracerag.tools._explain_runs import (
    RunSummary as RunSummary,
)
from tracerag.tools._explain_runs import (
    explain_queued as explain_queued,
)
from tracerag.tools._explain_runs import (
    explain_window as explain_window,
)
from tracerag.tools._explain_runs import (
    queued as queued,
)
from tracerag.tools._explain_runs import (
    sampled as sampled,
)
from tracerag.tools._replay import (
    ReplayRefused,
)

__all__ = ["CostTooHigh", "Explanation", "ReplayRefused", "explain"]
