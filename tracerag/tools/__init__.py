"""Tools built on tracerag's public API: adversarial self-test, calibration fitting, evaluation,
replay, quality indicators and the audit-trail viewer. The core never imports this package."""
