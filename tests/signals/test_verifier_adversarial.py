"""The adversarial self-test's acceptance bar for the default (lexical) backend."""

import pytest


@pytest.fixture
def report(lexical_report):
    return lexical_report


def test_every_changed_number_is_caught_including_values_stated_elsewhere(report):
    number = report.kinds["number"]
    assert number.total >= 200
    assert number.intercepted == number.total, number.misses[:3]


def test_most_entity_swaps_are_caught(report):
    entity = report.kinds["entity"]
    assert entity.total >= 40
    assert entity.intercepted / entity.total >= 0.8, entity.misses[:3]


def test_no_false_alarms_on_untouched_answers(report):
    assert report.eligible >= 40
    assert report.false_alarms == 0, report.false_alarm_examples[:3]
