from collections.abc import Sequence

import pytest

from tracerag.errors import ConfigurationError, InputError
from tracerag.signals._support import (
    Support,
    SupportBackend,
    available_backends,
    get_backend,
    register_backend,
    support,
)


class FixedBackend:
    name = "fixed"
    threshold = 0.5

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        return Support(0.9, True, material_text, 0, len(material_text), self.name)


def test_lexical_is_available_and_cached() -> None:
    assert "lexical" in available_backends()
    first = get_backend("lexical")
    assert first is get_backend("lexical")
    assert isinstance(first, SupportBackend)
    assert first.name == "lexical" and 0 < first.threshold < 1


def test_unknown_backend_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no-such-backend"):
        get_backend("no-such-backend")


def test_register_and_use_a_backend() -> None:
    register_backend("fixed-test", FixedBackend)
    result = support("claim", "material", backend="fixed-test")
    assert result.backend == "fixed" and result.supported


def test_an_instance_is_used_as_is() -> None:
    backend = FixedBackend()
    assert get_backend(backend) is backend
    assert support("claim", "material", backend=backend).score == 0.9


def test_a_non_backend_is_rejected() -> None:
    with pytest.raises(ConfigurationError):
        get_backend(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(("claim", "material"), [("", "text"), ("claim", "  "), ("\n", "")])
def test_empty_inputs_are_input_errors(claim: str, material: str) -> None:
    with pytest.raises(InputError):
        support(claim, material)
    with pytest.raises(InputError):
        get_backend("lexical")(claim, material)


def test_support_score_is_checked() -> None:
    with pytest.raises(ValueError):
        Support(1.5, True, "s", 0, 1, "x")
