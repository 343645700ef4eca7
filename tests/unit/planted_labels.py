"""Labelled support texts with wrong labels planted on purpose, for the label-issue tests.

Each text is three words of its label's vocabulary and four shared filler words, shuffled: a
bag-of-words model learns the labels from few rows, so a planted wrong label stands out.
"""

from __future__ import annotations

import random

WORDS = {
    "shipping": ("parcel", "courier", "tracking", "delivery", "package", "shipment", "arrive", "dispatch"),
    "billing": ("invoice", "charged", "statement", "payment", "card", "price", "fee", "overcharged"),
    "login": ("password", "signin", "locked", "reset", "code", "username", "twofactor", "logout"),
    "cancel": ("cancel", "subscription", "plan", "renewal", "terminate", "membership", "unsubscribe", "quit"),
}
LABELS = tuple(WORDS)
FILLER = ("please", "help", "today", "hello", "thanks", "urgent", "again", "still", "order", "week", "team")


def keyword_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows ``{"id", "text", "label"}``, the labels in turn, every text distinct."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < n:
        label = LABELS[len(rows) % len(LABELS)]
        words = rng.sample(WORDS[label], 5) + rng.sample(FILLER, 2)
        rng.shuffle(words)
        text = " ".join(words)
        if text not in seen:
            seen.add(text)
            rows.append({"id": f"t{len(rows):04d}", "text": text, "label": label})
    return rows


def flip(rows: list[dict[str, str]], share: float, seed: int = 0) -> dict[str, str]:
    """Give ``share`` of ``rows`` (at least one) another label, in place; {id: the true label}."""
    rng = random.Random(seed)
    flipped = {}
    for row in rng.sample(rows, max(1, round(share * len(rows)))):
        flipped[row["id"]] = row["label"]
        row["label"] = rng.choice([label for label in LABELS if label != row["label"]])
    return flipped
