"""Fitted confidence: learn from labelled responses how often answers with given signals are right.

``tracerag calibrate DATA.jsonl`` fits a calibration and writes it to a versioned JSON file
(``--from-desk`` adds, or alone uses, the review desk's decisions in the audit store as labels:
approve is a correct answer, edit and reject are not — see ``desk_examples``);
``CalibratedCombiner.from_file(path)`` turns it into a ``Combiner`` whose ``name`` — the
calibration id, e.g. ``logistic-3f2a9c1b`` — every Response records in ``calibration``. Set
``TRACERAG_CALIBRATION=path`` to have ``default_combiner()`` load it.

Data: one JSON object per line (a JSON array is accepted too). Either a row of signals::

    {"signals": {"citation_score": 1.0, "self_consistency": 0.8, "plan_ok": true,
                 "fabricated": false, "retrieval_margin": 0.12, "semantic_entropy": 0.5,
                 "citation_coverage": 1.0, "samples_ok": 5}, "correct": true}

or a stored record or Response — anything with ``signal_detail`` at the top level or under
``response`` (``fabricated_citations`` and ``rules`` are read from it) — plus the label. The
label is ``correct`` or ``label``: true/false, 1/0, or a word (``correct``, ``right``, ``yes``,
``approve`` are true; ``incorrect``, ``wrong``, ``no``, ``reject``, ``edit`` are false). Rows
without a label are skipped and counted. Missing signals are allowed (``null``).

Methods (numpy only):

``logistic``
    L2-regularised logistic regression on the signals above (standardised; a missing value
    takes the training mean), fitted by Newton's method (IRLS).
``isotonic``
    a monotone map from the heuristic confidence (``heuristic-v1``) to the observed share of
    right answers, fitted by pool-adjacent-violators and interpolated linearly.

Either way the combiner keeps the heuristic's hard rules: a fabricated citation or a failed
required rule caps the confidence at ``cap`` (just below the escalation line), each failed
optional rule multiplies it by 0.85, and no successful sample gives 0.

The calibration file: ``format`` ("tracerag.calibration"), ``format_version``, ``id``,
``method``, ``features``, ``model`` (coefficients or breakpoints), ``fitted_at``, ``n``,
``n_correct``, and ``provenance`` (data hash and evaluation figures). The id is the method and
the first 8 hex digits of the SHA-256 of the canonical JSON of format version, method,
features, model and n; loading a file whose content does not match its id fails.


The work is in private modules, one concern each: ``_calibration_data`` (the labelled rows),
``_calibration_fit`` (the fits), ``_calibration_report`` (the comparison), ``_calibration_demo``
(a synthetic set) and ``_calibration_command`` (``tracerag calibrate``). This module is their
public face.
"""

from __future__ import annotations

# The parts' names, importable from here as before (``X as X``: an explicit re-export; the
# documented ones are in __all__).
from tracerag.tools._calibration_data import Example, read_examples
from tracerag.tools._calibration_data import desk_examples as desk_examples
from tracerag.tools._calibration_data import examples_hash as examples_hash
from tracerag.tools._calibration_data import label_of as label_of
from tracerag.tools._calibration_data import signals_from_row as signals_from_row
from tracerag.tools._calibration_demo import demo_calibration_rows as demo_calibration_rows
from tracerag.tools._calibration_fit import fit_calibration
from tracerag.tools._calibration_fit import fit_isotonic as fit_isotonic
from tracerag.tools._calibration_fit import fit_logistic as fit_logistic
from tracerag.tools._calibration_report import compare as compare
from tracerag.tools._calibration_report import render_comparison as render_comparison
from tracerag.tools._calibration_report import split_holdout as split_holdout

__all__ = ["Example", "fit_calibration", "read_examples"]
