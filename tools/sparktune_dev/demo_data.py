"""Demo data files: the support tickets of :mod:`sparktune.model.builtin_corpus` written to a file,
and a helpdesk export of another shape.

``--out PATH`` writes :func:`~sparktune.model.builtin_corpus.generate_support_tickets` (the seed use
case, dirty on purpose: its docstring lists the defects) as JSONL, Parquet or CSV, chunk by chunk;
``--tickets-csv PATH`` writes :func:`generate_helpdesk_tickets` as a helpdesk tool exports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from sparktune.model.builtin_corpus import (
    BLOCK_ROWS,
    SCHEMA,
    SLOT_POOLS,
    Slots,
    generate_support_tickets,
    template_fields,
)

# A whole number of blocks: a chunk ending inside a block would have the next chunk draw it again.
_WRITE_CHUNK_ROWS = 32 * BLOCK_ROWS

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".csv": "csv"}


# --- a helpdesk export: the same domain in another shape --------------------------------------
#
# What a team exports from its helpdesk tool, unlike the demo data in every way a pipeline can
# trip over: other column names (``body`` and ``category``, no quality score), more labels (12),
# longer multi-sentence texts (a few hundred characters), class imbalance (the largest category
# about 10x the smallest, every one with at least 40 rows), a written-out CSV (UTF-8 with a byte
# order mark, CRLF line ends, quoted fields holding newlines, commas and quotes), and duplicates:
#
# ==========================  =======  ==========================================================
# row                         rate     what it looks like
# ==========================  =======  ==========================================================
# exact duplicate             ~5 %     an earlier ticket of its category re-sent word for word
# near-duplicate              ~8 %     an earlier ticket re-sent with small edits: case,
#                                      punctuation, spacing, a changed word, a line added
# mislabelled                 ~3 %     the text of another category (an agent's wrong pick)
# ==========================  =======  ==========================================================
#
# Categories come in families that share their words (money: billing_dispute, refund_status,
# payment_failed, cancel_subscription; access: login_issue, account_security, account_update;
# delivery: delivery_delay, damaged_item, wrong_item; app: app_crash, slow_performance), and every
# ticket carries context sentences common to all categories ("I had a refund problem last month"),
# so no single keyword gives the label away: a bag-of-words baseline does well, not perfectly.

HELPDESK_CATEGORIES: tuple[str, ...] = (  # largest first: the shares fall geometrically
    "billing_dispute",
    "login_issue",
    "delivery_delay",
    "refund_status",
    "app_crash",
    "cancel_subscription",
    "damaged_item",
    "payment_failed",
    "account_update",
    "slow_performance",
    "wrong_item",
    "account_security",
)
HELPDESK_TEXT_COLUMN = "body"
HELPDESK_LABEL_COLUMN = "category"
HELPDESK_COLUMNS: tuple[str, ...] = ("ticket_id", "created_at", "channel", "priority", "body", "category")
HELPDESK_ROWS = 2500
# Largest category over smallest; the shares in between fall geometrically.
HELPDESK_IMBALANCE = 10.0
HELPDESK_EXACT_DUPLICATE_RATE = 0.05
HELPDESK_NEAR_DUPLICATE_RATE = 0.08
HELPDESK_MISLABEL_RATE = 0.03
# Not 1 or 2: builtin_corpus's ticket and corpus streams, so no draw is shared with them.
_HELPDESK_STREAM = 3

_HELPDESK_CORE: dict[str, tuple[str, ...]] = {
    "billing_dispute": (
        "I was charged {amount} on {date} for the {plan}, but I never upgraded to it.",
        "My statement shows two charges of {amount} for the same month and I only have one account.",
        "The invoice for {date} still lists seats we removed weeks ago, so the total of {amount} is wrong.",
        "You billed me the annual price although I picked monthly billing at checkout.",
        "There is a payment of {amount} to you on my card that I do not recognise at all.",
        "The price went up to {amount} without any notice, and I only agreed to pay the old rate.",
        "Tax was added twice on my last invoice, can someone correct the amount?",
        "I was billed for the {plan} after the trial even though I downgraded before it ended.",
    ),
    "refund_status": (
        "You confirmed a refund of {amount} on {date} and it still has not reached my card.",
        "It has been {days} days since I returned the {product} and I have not seen the money back yet.",
        "Your agent said the refund for order {order} was processed, but my bank sees nothing.",
        "Can you tell me where my refund is? The return reached your warehouse on {date}.",
        "I was promised a refund when I asked to cancel, how long does it usually take to show up?",
        "The refund came back as {amount} instead of the full price I paid for the {product}.",
        "My refund for order {order} has shown as pending for {days} days now.",
        "Could you send me a corrected invoice showing the refund? I need it for my records.",
    ),
    "payment_failed": (
        "My card keeps getting declined when I pay for the {plan}, even though my bank says it is fine.",
        'Checkout fails at the last step with "{error}" and the order is never placed.',
        "I tried to pay {amount} with {wallet} and it just spins and then says it failed.",
        "The renewal charge did not go through on {date} and now my account shows a warning banner.",
        "I entered my new card details three times and each time the card was rejected.",
        "Paying with {wallet} does not work, it says the method is not accepted.",
        "My order {order} is stuck because the payment did not go through, can I pay another way?",
        "The bank texted me a code but your page timed out before I could enter it.",
    ),
    "login_issue": (
        "I cannot sign in on my {device}, it says my password is incorrect even right after I reset it.",
        "The password reset email never arrives at {email}, and I checked the spam folder too.",
        "After the update to {version} the app logs me out every time I close it and I cannot get back in.",
        "I don't receive the two-factor code anymore, so I'm stuck on the login screen.",
        "My account got locked after a few wrong password attempts and the unlock link has expired.",
        'Single sign-on with my work account shows "{error}" and sends me back to the login page.',
        "I changed my phone and the authenticator app is gone, now I can't log in.",
        "The login page just reloads when I enter my email and password, nothing else happens.",
    ),
    "account_security": (
        "I got an email saying my password was changed, but I did not change it.",
        "There is a login from {city} in my account history and I have never been there.",
        "Someone placed order {order} from my account, it was not me, please lock it.",
        "The email address on my account was changed to one I do not know, I think I was hacked.",
        "I received a two-factor code I did not ask for, is someone trying to get into my account?",
        "A new device called {device} appeared in my account and it does not belong to me.",
        "My saved card was used for {amount} on {date} by someone else through my account.",
        "Please check my account for suspicious activity, I think my password leaked.",
    ),
    "account_update": (
        "I need to change the email on my account to {email}, the old address no longer works.",
        "Please update my billing address to {street}, {city}.",
        "How do I change the name on my profile? It still shows my old surname.",
        "I want to add a colleague as a second user on our {plan}.",
        "Can you change the phone number on my account to {phone}? I lost the old number.",
        "I moved to {city} and need the country and currency of my account updated.",
        "Please merge my two accounts, one under {email} and one under my work address.",
        "I want to make {name} the account owner before I leave the company.",
    ),
    "delivery_delay": (
        "Order {order} was supposed to arrive on {date} and the tracking has not moved since.",
        "{carrier} says the parcel is delayed again and nobody can tell me when the {product} will come.",
        "It has been {days} days and my package is still showing as in transit.",
        "The tracking for order {order} says delivered but there was nothing at my door.",
        "My parcel has been sitting at the depot in {city} for a week.",
        "I paid for express shipping and the {product} is already {days} days late.",
        "The estimated delivery keeps moving, first it was {date} and now it says next week.",
        "Order {order} still says preparing for shipment after {days} days.",
    ),
    "damaged_item": (
        "The {product} arrived with a cracked housing and it does not turn on.",
        "The box was crushed and the {product} inside is bent, I have photos.",
        "My {product} from order {order} came with a broken part, can you send a replacement?",
        "When I opened the package the {product} was scratched all over and one piece was snapped off.",
        "The {product} stopped working on the second day and gives off a burning smell.",
        "Liquid leaked inside the parcel and the {product} is ruined.",
        "The screen of the {product} was shattered when it arrived on {date}.",
        "The {product} was clearly used before, it has marks and the seal was open.",
    ),
    "wrong_item": (
        "I ordered the {product} but the parcel contained a {product2}.",
        "Order {order} arrived in the wrong size, I asked for large and got small.",
        "You sent me the {product} in white instead of the black one I ordered.",
        "The package for order {order} had someone else's items in it.",
        "Only half of my order arrived: the {product} is here, the {product2} is not. Can I cancel the rest?",
        "The label says {product} but the box has a completely different model inside.",
        "I received two of the {product2} and none of the {product} I paid for.",
        "The item in order {order} does not match the photo on the site at all.",
    ),
    "app_crash": (
        "The app closes itself as soon as I open the settings page on my {device}.",
        "Since version {version} the app closes by itself when I upload a photo.",
        "I get error {error} every time I try to export a report, and then the app quits.",
        "The app freezes on the splash screen on my {device} and I have to force close it.",
        "Clicking save shows a blank white page with {error}.",
        "The app crashes when I switch to dark mode on version {version}.",
        "Tapping a notification opens the app and then it immediately crashes.",
        "The web page throws {error} and the form loses everything I typed.",
    ),
    "slow_performance": (
        "The dashboard has taken over a minute to load since {date}.",
        "Search has become very slow, every query takes {days} seconds or more.",
        "The app is really sluggish on my {device} after the update to {version}, scrolling lags a lot.",
        "Uploading a small file takes forever, the progress bar barely moves.",
        "Sync between my {device} and the web app now needs hours instead of seconds.",
        "Pages load so slowly in the evenings that the app is almost unusable.",
        "Reports that used to open instantly now time out with {error} about half the time.",
        "Everything in the app feels laggy since version {version}, even typing has a delay.",
    ),
    "cancel_subscription": (
        "Please cancel my {plan} before it renews on {date}.",
        "I want to close my subscription, I no longer use the service.",
        "How do I stop the automatic renewal? I cannot find the option on my {device}.",
        "I turned off renewal in the app but the {plan} still shows as active.",
        "Please end my membership at the end of this billing period and confirm by email to {email}.",
        "I signed up for the free trial and do not want it to turn into the paid {plan}.",
        "We are moving to another provider, please remove all seats on our {plan} from next month.",
        "Terminate my subscription, and please make sure I am not charged again.",
    ),
}

# Sentences any category's ticket may carry: they mention other categories' words on purpose.
_HELPDESK_CONTEXT = (
    "I have been a customer for {years} years.",
    "We are on the {plan}.",
    "I use the app on my {device}, version {version}.",
    "Last month I had a problem with a refund and it was sorted quickly, so I hope this will be too.",
    "My previous order {order} arrived fine, so this is new.",
    "I already reset my password once this week for another reason.",
    "I read the help center articles about billing, delivery and login problems but found nothing.",
    "My customer number is {customer}.",
    "I contacted you on {date} by chat but the conversation was closed without an answer.",
    "I'm writing on behalf of our team of {qty} people.",
    "This is the second time I'm writing about this.",
    "I paid {amount} with {wallet}, in case you need it.",
    "The app itself works fine otherwise.",
    "It takes ages to reach anyone by phone, so I am writing here.",
    "Honestly, if this is not sorted out soon I will cancel.",
    "Our invoices and payment receipts go to {email}.",
    "Nothing has changed on my account recently.",
)
_HELPDESK_OPENINGS = (
    "",
    "",
    "Hi,",
    "Hello team,",
    "Hi support,",
    "Dear Sir or Madam,",
    "Good morning,",
    "Hey,",
    "Hi {agent},",
)
_HELPDESK_CLOSINGS = (
    "",
    "Thanks,\n{name}",
    "Regards,\n{name}",
    "Thank you in advance.",
    "Please get back to me soon.",
    "Best, {name}",
    "Cheers",
    "Kind regards,\n{name} ({email})",
)
# A re-sent ticket with "a changed word": the first of these found in the text is swapped.
_HELPDESK_WORD_SWAPS = (
    ("please", "pls"),
    ("Please", "Pls"),
    ("order", "purchase"),
    ("still", "yet again"),
    ("cannot", "can't"),
    ("does not", "doesn't"),
    ("I have", "I've"),
    ("account", "profile"),
    ("app", "application"),
)
_HELPDESK_FOLLOW_UPS = ("Any update?", "Still waiting on this.", "Sending this again.", "Hello??")
_HELPDESK_CHANNELS = ("email", "email", "web form", "web form", "chat", "phone")
_HELPDESK_PRIORITIES = ("normal", "normal", "normal", "low", "high", "urgent")
_HELPDESK_FIRST_TIME = np.datetime64("2024-06-03T08:00:00")

_HELPDESK_CORE_FIELDS = {c: tuple(template_fields(t) for t in ts) for c, ts in _HELPDESK_CORE.items()}
assert set(_HELPDESK_CORE) == set(HELPDESK_CATEGORIES)
assert all(
    f in SLOT_POOLS
    for ts in (*_HELPDESK_CORE.values(), _HELPDESK_CONTEXT, _HELPDESK_OPENINGS, _HELPDESK_CLOSINGS)
    for t in ts
    for f in template_fields(t)
)


def helpdesk_category_counts(n_rows: int = HELPDESK_ROWS) -> dict[str, int]:
    """Rows per category in an export of ``n_rows``: shares falling geometrically from the first
    category to the last, ``HELPDESK_IMBALANCE`` times apart, rounded to sum to ``n_rows``."""
    k = len(HELPDESK_CATEGORIES)
    weights = HELPDESK_IMBALANCE ** (-np.arange(k) / (k - 1))
    exact = n_rows * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    # largest remainders first, so the total is exact and the order of sizes is kept
    for i in np.argsort(-(exact - counts), kind="stable")[: n_rows - int(counts.sum())]:
        counts[i] += 1
    return dict(zip(HELPDESK_CATEGORIES, counts.tolist(), strict=True))


def _helpdesk_text(rng: np.random.Generator, category: str, slots: tuple[Slots, Slots], row: int) -> str:
    """One ticket body of ``category``: opening, context, one or two core sentences, closing.

    The core sentences fill their slots from ``slots[0]``, the rest from ``slots[1]``: a context
    sentence never repeats the order number of the problem it introduces."""
    slots, other = slots
    cores, core_fields = _HELPDESK_CORE[category], _HELPDESK_CORE_FIELDS[category]
    picks = rng.choice(len(cores), size=3, replace=False).tolist()
    n_cores = int(rng.choice((1, 2, 3), p=(0.2, 0.6, 0.2)))
    sentences = [slots.fill(cores[p], core_fields[p], row) for p in picks[:n_cores]]
    n_context = int(rng.choice(3, p=(0.1, 0.45, 0.45)))
    for c in rng.choice(len(_HELPDESK_CONTEXT), size=n_context, replace=False).tolist():
        sentence = other.fill(_HELPDESK_CONTEXT[c], template_fields(_HELPDESK_CONTEXT[c]), row)
        # context opens the ticket more often than it follows the problem
        sentences.insert(0 if rng.random() < 0.6 else len(sentences), sentence)
    paragraph_style = rng.random() < 0.2
    body = ("\n" if paragraph_style else " ").join(sentences)
    opening = _HELPDESK_OPENINGS[int(rng.integers(len(_HELPDESK_OPENINGS)))]
    closing = _HELPDESK_CLOSINGS[int(rng.integers(len(_HELPDESK_CLOSINGS)))]
    if opening:
        body = (
            other.fill(opening, template_fields(opening), row)
            + ("\n\n" if rng.random() < 0.5 else " ")
            + body
        )
    if closing:
        body += "\n\n" + other.fill(closing, template_fields(closing), row)
    return body.lower() if rng.random() < 0.06 else body


def _near_duplicate(rng: np.random.Generator, text: str) -> str:
    """``text`` re-sent with one or two small edits (case, punctuation, spacing, a word, a line)."""
    edited = text
    for edit in rng.choice(5, size=int(rng.integers(1, 3)), replace=False).tolist():
        if edit == 0:  # case
            edited = edited.lower() if rng.random() < 0.6 else edited[:1].swapcase() + edited[1:]
        elif edit == 1:  # punctuation
            choice = rng.random()
            if choice < 0.4:
                edited = edited.replace(",", "")
            elif choice < 0.7:
                edited = edited.rstrip(".!") + "!!"
            else:
                edited = edited.replace(". ", ".. ", 1)
        elif edit == 2:  # a changed word
            present = [(a, b) for a, b in _HELPDESK_WORD_SWAPS if a in edited]
            if present:
                a, b = present[int(rng.integers(len(present)))]
                edited = edited.replace(a, b, 1)
        elif edit == 3:  # spacing
            edited = "  " + edited.replace(" ", "  ", 1) + " "
        else:  # a follow-up line
            edited += "\n" + _HELPDESK_FOLLOW_UPS[int(rng.integers(len(_HELPDESK_FOLLOW_UPS)))]
    if edited == text:
        edited += " " + _HELPDESK_FOLLOW_UPS[0]
    return edited


def generate_helpdesk_tickets(n_rows: int = HELPDESK_ROWS, seed: int = 7) -> pa.Table:
    """A helpdesk export of ``n_rows`` tickets (all columns strings, in :data:`HELPDESK_COLUMNS`).

    The same ``(n_rows, seed)`` gives the same table. Categories have exactly
    :func:`helpdesk_category_counts` rows each, duplicates and mislabelled rows included (a copy
    keeps its category; a mislabelled row keeps its category and borrows another's text).
    """
    if n_rows < len(HELPDESK_CATEGORIES):
        raise ValueError(f"n_rows must be at least {len(HELPDESK_CATEGORIES)} (one a category), got {n_rows}")
    rng = np.random.default_rng([seed, _HELPDESK_STREAM])
    counts = helpdesk_category_counts(n_rows)
    labels = np.repeat(np.arange(len(HELPDESK_CATEGORIES)), list(counts.values()))
    labels = rng.permutation(labels).tolist()
    slots = (Slots(rng, n_rows), Slots(rng, n_rows))
    kind = rng.random(n_rows)
    bodies: list[str] = []
    originals: dict[int, list[int]] = {}  # category -> rows holding a first sending
    for i, label in enumerate(labels):
        earlier = originals.get(label, [])
        if earlier and kind[i] < HELPDESK_EXACT_DUPLICATE_RATE + HELPDESK_NEAR_DUPLICATE_RATE:
            source = bodies[earlier[int(rng.integers(len(earlier)))]]
            exact = kind[i] < HELPDESK_EXACT_DUPLICATE_RATE
            bodies.append(source if exact else _near_duplicate(rng, source))
            continue
        category = HELPDESK_CATEGORIES[label]
        if rng.random() < HELPDESK_MISLABEL_RATE:
            other = (label + int(rng.integers(1, len(HELPDESK_CATEGORIES)))) % len(HELPDESK_CATEGORIES)
            category = HELPDESK_CATEGORIES[other]
        bodies.append(_helpdesk_text(rng, category, slots, i))
        originals.setdefault(label, []).append(i)
    seconds = np.cumsum(rng.integers(30, 1800, n_rows))
    created = np.datetime_as_string(_HELPDESK_FIRST_TIME + seconds.astype("timedelta64[s]"), unit="s")
    columns = {
        "ticket_id": [f"TCK-{104_200 + i}" for i in range(n_rows)],
        "created_at": [t.replace("T", " ") for t in created.tolist()],
        "channel": [_HELPDESK_CHANNELS[k] for k in rng.integers(0, len(_HELPDESK_CHANNELS), n_rows).tolist()],
        "priority": [
            _HELPDESK_PRIORITIES[k] for k in rng.integers(0, len(_HELPDESK_PRIORITIES), n_rows).tolist()
        ],
        "body": bodies,
        "category": [HELPDESK_CATEGORIES[k] for k in labels],
    }
    return pa.table({name: pa.array(columns[name], pa.string()) for name in HELPDESK_COLUMNS})


def write_helpdesk_csv(path: str | Path, n_rows: int = HELPDESK_ROWS, seed: int = 7) -> Path:
    """Write :func:`generate_helpdesk_tickets` as a helpdesk tool exports it, atomically; return the path.

    UTF-8 with a byte order mark, a header row, CRLF after every record, fields quoted only when
    they must be (RFC 4180: a comma, a quote or a newline inside; quotes doubled). Newlines inside
    a body stay LF, as spreadsheet cells keep them. Read it back with ``encoding="utf-8-sig"``.
    """
    import csv

    path = Path(path).expanduser().resolve()
    table = generate_helpdesk_tickets(n_rows, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8-sig", newline="") as f:
            writer = csv.writer(f, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
            writer.writerow(HELPDESK_COLUMNS)
            writer.writerows(zip(*(table.column(c).to_pylist() for c in HELPDESK_COLUMNS), strict=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --- writers ---------------------------------------------------------------------------------


def _chunks(n_rows: int, seed: int) -> Iterator[pa.Table]:
    for start in range(0, n_rows, _WRITE_CHUNK_ROWS):
        yield generate_support_tickets(min(_WRITE_CHUNK_ROWS, n_rows - start), seed, start_row=start)


def _write_jsonl(path: Path, n_rows: int, seed: int) -> None:
    # json.dumps per value: pandas' writer escapes every "/" and pyarrow has no JSON writer
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for chunk in _chunks(n_rows, seed):
            cols = chunk.to_pydict()
            f.writelines(
                f'{{"message":{dumps(m)},"intent_label":{dumps(lab)},"quality_score":{q!r},'
                f'"message_hash":"{h}","created_date":"{d}"}}\n'
                for m, lab, q, h, d in zip(
                    cols["message"],
                    cols["intent_label"],
                    cols["quality_score"],
                    cols["message_hash"],
                    cols["created_date"],
                    strict=True,
                )
            )


def _write_parquet(path: Path, n_rows: int, seed: int) -> None:
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, SCHEMA, compression="zstd") as writer:
        for chunk in _chunks(n_rows, seed):
            writer.write_table(chunk)


def _write_csv(path: Path, n_rows: int, seed: int) -> None:
    import pyarrow.csv as pacsv

    # messages hold newlines and quotes: readers need multiLine / escape '"' (RFC 4180 quoting)
    with pacsv.CSVWriter(path, SCHEMA) as writer:
        for chunk in _chunks(n_rows, seed):
            writer.write_table(chunk)


_WRITERS = {"jsonl": _write_jsonl, "parquet": _write_parquet, "csv": _write_csv}


def write_demo_dataset(path: str | Path, n_rows: int, seed: int = 7, fmt: str | None = None) -> Path:
    """Write ``n_rows`` generated tickets to ``path`` atomically; return the path.

    ``fmt`` is ``jsonl``, ``parquet`` or ``csv``; by default it follows the suffix. The file is
    written next to its target under a temporary name and renamed, so a reader never sees half of it.
    """
    path = Path(path).expanduser().resolve()
    if fmt is None:
        fmt = _FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(
                f"Cannot tell the format of {path.name!r} from its suffix: use one of "
                f"{', '.join(sorted(_FORMATS))} or pass fmt='jsonl' | 'parquet' | 'csv'."
            )
    if fmt not in _WRITERS:
        raise ValueError(f"Unknown format {fmt!r}: use one of {', '.join(_WRITERS)}.")
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _WRITERS[fmt](tmp, n_rows, seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    from sparktune.core.config import settings

    parser = argparse.ArgumentParser(
        prog="python -m sparktune_dev.demo_data",
        description="Write generated customer-support tickets (with realistic defects) to a file.",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"number of rows (default: 3000; {HELPDESK_ROWS} with --tickets-csv)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output file (.jsonl, .parquet or .csv); default: the demo source",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    parser.add_argument("--format", choices=sorted(_WRITERS), default=None, help="default: from the suffix")
    parser.add_argument(
        "--tickets-csv",
        type=Path,
        default=None,
        metavar="PATH",
        help="instead of the demo data, write a helpdesk export of another shape to PATH: columns body "
        "and category (12 imbalanced categories), longer texts, duplicates and near-duplicates, CSV "
        "with a BOM and CRLF line ends; train on it with text_column=body, label_column=category, "
        "quality_column=''",
    )
    args = parser.parse_args(argv)
    if args.tickets_csv is not None and (args.out is not None or args.format is not None):
        parser.error("--tickets-csv writes its own file: leave out --out and --format")
    started = time.perf_counter()
    try:
        if args.tickets_csv is not None:
            rows = HELPDESK_ROWS if args.rows is None else args.rows
            written = write_helpdesk_csv(args.tickets_csv, rows, args.seed)
        else:
            rows = 3000 if args.rows is None else args.rows
            out = args.out or settings().demo_source_path
            written = write_demo_dataset(out, rows, args.seed, args.format)
    except ValueError as exc:
        parser.error(str(exc))
    size_mb = written.stat().st_size / 1e6
    print(
        f"wrote {rows:,} rows (seed {args.seed}) to {written} "
        f"({size_mb:.1f} MB in {time.perf_counter() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
