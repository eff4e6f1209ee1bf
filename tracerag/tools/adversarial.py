"""Adversarial self-test of the citation verifier: does it catch answers that were made wrong?

Real answers with their retrieved materials — by default the demo knowledge base's questions
answered through ``RAGPipeline`` by the offline ``ExtractiveChatModel`` at several seeds, or
the stored records of an audit store — are mutated one claim at a time:

``fabricated``
    the claim cites an id that was never retrieved;
``wrong_material``
    the claim's citation moves to another retrieved (current) material;
``number``
    an amount, percentage, duration or number of the claim is changed;
``date``
    a date of the claim is shifted (day, month or year);
``entity``
    a product, plan, tier, payment or other named entity is swapped for one that occurs in
    another material;
``negation``
    a negation is added to or removed from the claim (English and Chinese).

Only claims that the verifier supported before the mutation are mutated. A mutation is
*intercepted* when the mutated claim is no longer ``supported``. Unmutated answers whose claims
all cite retrieved, current materials measure the *false-alarm rate*: the share of them in
which the verifier flags any claim. (With stored records, whose answers may really be wrong,
that rate is a flag rate.) ``tracerag audit adversarial`` exits non-zero when a mutation type's
interception rate is below its floor or false alarms exceed the maximum.


The work is in private modules, one concern each: ``_adversarial_cases`` (what is mutated),
``_adversarial_quantities`` and ``_adversarial_mutations`` (how), ``_adversarial_report`` (the
scoring) and ``_adversarial_command`` (``tracerag audit adversarial``). This module is their
public face.
"""

from __future__ import annotations

# The parts' names, importable from here as before (``X as X``: an explicit re-export; the
# documented ones are in __all__).
from tracerag.tools._adversarial_cases import (
    DEFAULT_ENTITY_GROUPS as DEFAULT_ENTITY_GROUPS,
)
from tracerag.tools._adversarial_cases import (
    DEFAULT_SEEDS as DEFAULT_SEEDS,
)
from tracerag.tools._adversarial_cases import (
    PROBE_QUESTIONS as PROBE_QUESTIONS,
)
from tracerag.tools._adversarial_cases import (
    Case as Case,
)
from tracerag.tools._adversarial_cases import (
    cases_from_records as cases_from_records,
)
from tracerag.tools._adversarial_cases import (
    demo_cases as demo_cases,
)
from tracerag.tools._adversarial_cases import (
    demo_questions as demo_questions,
)
from tracerag.tools._adversarial_cases import (
    demo_records as demo_records,
)
from tracerag.tools._adversarial_cases import (
    relevant_documents as relevant_documents,
)
from tracerag.tools._adversarial_cases import (
    store_cases as store_cases,
)
from tracerag.tools._adversarial_command import parse_floors as parse_floors
from tracerag.tools._adversarial_mutations import (
    MUTATION_KINDS as MUTATION_KINDS,
)
from tracerag.tools._adversarial_mutations import (
    Inventory as Inventory,
)
from tracerag.tools._adversarial_mutations import (
    MutatingChatModel,
)
from tracerag.tools._adversarial_mutations import (
    Mutation as Mutation,
)
from tracerag.tools._adversarial_mutations import (
    claim_mutations as claim_mutations,
)
from tracerag.tools._adversarial_mutations import (
    claim_segments as claim_segments,
)
from tracerag.tools._adversarial_mutations import (
    mutate_answer as mutate_answer,
)
from tracerag.tools._adversarial_quantities import (
    quantity_mutations as quantity_mutations,
)
from tracerag.tools._adversarial_report import (
    DEFAULT_FLOORS as DEFAULT_FLOORS,
)
from tracerag.tools._adversarial_report import (
    DEFAULT_MAX_FALSE_ALARM as DEFAULT_MAX_FALSE_ALARM,
)
from tracerag.tools._adversarial_report import (
    AdversarialReport,
    run_adversarial,
)
from tracerag.tools._adversarial_report import (
    KindResult as KindResult,
)

__all__ = ["AdversarialReport", "MutatingChatModel", "run_adversarial"]
