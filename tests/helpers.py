"""Small helpers the test modules share."""


def flat(text: str) -> str:
    """A failure text with its wrapping undone (whitespace runs become one space), for substring asserts."""
    return " ".join(text.split())
