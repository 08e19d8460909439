"""Error types."""


class SpecSamplerInputError(ValueError, AssertionError):
    """Bad sampler input.

    Derives from ValueError (what new code should catch) and AssertionError (what code written
    against vLLM V0's strict-mode asserts catches).
    """


def input_error(argument: str, expected: str, actual: object) -> SpecSamplerInputError:
    """Error naming the argument, what was expected and what was given."""
    return SpecSamplerInputError(f"{argument}: expected {expected}, got {actual}")
