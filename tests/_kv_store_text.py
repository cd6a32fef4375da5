"""A varied, deterministic text for the prefix store's tests and bench: a
document of numbered facts in changing words, then a question about it."""

from __future__ import annotations

_SUBJECTS = ["The harbor", "A violinist", "Our committee", "The glacier", "Each sparrow", "Marta"]
_VERBS = ["recorded", "painted", "argued about", "measured", "forgot", "carried"]
_OBJECTS = [
    "the copper kettle",
    "seventeen lanterns",
    "a map of Lisbon",
    "the tidal chart",
    "an unfinished sonnet",
    "two crates of figs",
]
_WHEN = ["at dawn", "in 1987", "during the storm", "after the vote", "on Tuesday", "twice"]


def document(n_facts: int) -> str:
    lines = []
    for i in range(n_facts):
        s = _SUBJECTS[i % 6]
        v = _VERBS[(i * 5 + 1) % 6]
        o = _OBJECTS[(i * 7 + 2) % 6]
        w = _WHEN[(i * 11 + 3) % 6]
        lines.append(f"Fact {i}: {s} {v} {o} {w}, number {(i * 37) % 101}.")
    return "\n".join(lines)


def prompt(n_facts: int, question: str = "What did the glacier do in fact 3?") -> str:
    return f"{document(n_facts)}\n\nQuestion: {question}\nAnswer:"
