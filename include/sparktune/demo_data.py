"""A deterministic generator of customer-support messages: the seed use case and the benchmark data.

Each row is a support message labelled with one of :data:`INTENTS`. Messages are composed from
parts (a greeting, one or two intent-specific sentences with slot fillers such as order numbers,
products, amounts and dates, an optional neutral remark and a sign-off), so the wording varies a
lot while the intent stays recoverable from keywords: a fine-tuned model can reach high accuracy.

The data is dirty on purpose, so that every filter of the preparation has work. The rates are
drawn independently per row (a duplicate copies a whole earlier row, defects included):

==========================  =======  ==========================================================
defect                      rate     what it looks like
==========================  =======  ==========================================================
null label                  ~2 %     ``intent_label`` is null, the message is a normal one
stub                        ~3 %     under 20 characters once trimmed ("help!!", "  hi  ")
too long                    ~1 %     over 2,048 characters: a message with a pasted log
exact duplicate             ~5 %     an earlier row re-sent: same message, hash and label
low quality                 ~10 %    ``quality_score`` < 0.85; half of these carry a wrong label
==========================  =======  ==========================================================

Good rows have ``quality_score`` in [0.85, 1.0]. Stubs come from a small pool, so they also
repeat among themselves, like real "hi" messages do.

Rows are generated in fixed blocks, each seeded by ``(seed, block number)``, so a row's content
depends only on the seed and its row number: any chunking yields the same rows, and millions of
rows are produced chunk by chunk with numpy and pyarrow, never as millions of Python dicts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import string
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

INTENTS: tuple[str, ...] = (
    "billing_refund",
    "password_reset",
    "shipping_delay",
    "cancel_subscription",
    "technical_bug",
    "account_update",
    "product_question",
    "complaint",
    "order_change",
    "payment_declined",
)

SCHEMA = pa.schema(
    [
        pa.field("message", pa.string(), nullable=False),
        pa.field("intent_label", pa.string()),
        pa.field("quality_score", pa.float64(), nullable=False),
        pa.field("message_hash", pa.string(), nullable=False),
        pa.field("created_date", pa.string(), nullable=False),
    ]
)

NULL_LABEL_RATE = 0.02
STUB_RATE = 0.03
LONG_RATE = 0.01
DUPLICATE_RATE = 0.05
LOW_QUALITY_RATE = 0.10
# Share of low-quality rows whose label is wrong: the quality filter then matters for accuracy.
LOW_QUALITY_WRONG_LABEL_RATE = 0.5
MIN_GOOD_QUALITY = 0.85

# Rows per independently seeded block; fixed forever, since changing it changes every row.
_BLOCK_ROWS = 4096
_WRITE_CHUNK_ROWS = 32 * _BLOCK_ROWS
_FIRST_DATE = np.datetime64("2024-01-01")
_DATE_SPAN_DAYS = 731
# Separate random streams, so the corpus and the tickets never share draws.
_TICKET_STREAM = 1
_CORPUS_STREAM = 2

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".csv": "csv"}

# --- message parts ---------------------------------------------------------------------------

_CORE: dict[str, tuple[str, ...]] = {
    "billing_refund": (
        "My card was charged twice for order {order}, please refund the duplicate payment.",
        "I was billed {amount} for {product} but the price on the site was lower. I want a refund.",
        "Can I get a refund for {product}? I returned it on {date} and still have not seen the money.",
        "There is a charge of {amount} on my statement that I don't recognise, please refund it.",
        "You charged me {amount} after I already got a refund approved for order {order}.",
        "The invoice for order {order} shows {amount}, which is more than I paid. Please fix the billing.",
        "I was double charged this month. Please send the refund of {amount} to my card.",
        "When will my refund for order {order} arrive? It has been {days} days.",
        "I got charged for the {plan} even though I am on the free tier. I need my money back.",
        "The refund you promised on {date} never reached my bank account.",
        "Please reverse the charge of {amount}, it was billed by mistake.",
        "My bank shows two payments of {amount} for the same order {order}.",
        "I'd like my money back for {product}, it was overcharged at checkout.",
        "Why was I billed {amount} twice? Refund the extra charge please.",
    ),
    "password_reset": (
        "I forgot my password and the reset link never arrives at {email}.",
        "I can't log in to my account, it says my password is wrong even after resetting it.",
        "The password reset email expired before I could use it. Can you send a new reset link?",
        "My account is locked after too many login attempts, I need to reset my password.",
        "How do I reset my password? The 'forgot password' button does nothing on my {device}.",
        "I don't get the two-factor code anymore, so I am locked out of my account.",
        "Please help me reset the password for {email}, I can't sign in since {date}.",
        "The login page keeps rejecting my new password, I've reset it {days} times already.",
        "I changed phones and lost my authenticator app, now I can't log in.",
        "Your reset password link gives an 'invalid token' message.",
        "I'm locked out. Can you unlock my account and let me set a new password?",
        "Sign-in fails with 'incorrect password' although I just reset it on my {device}.",
        "I never received the password reset code by SMS.",
    ),
    "shipping_delay": (
        "My order {order} was supposed to arrive on {date} and it still hasn't shipped.",
        "The tracking for order {order} has not updated in {days} days. Where is my package?",
        "{carrier} says my parcel is delayed again. When will {product} be delivered?",
        "It has been {days} days and my package has not arrived yet.",
        "The delivery of {product} is late, tracking shows it stuck in {city}.",
        "My parcel was marked delivered by {carrier} but I never received it.",
        "Order {order} still says 'preparing for shipment' after {days} days.",
        "Can you check the shipping status of order {order}? The tracking number doesn't work.",
        "I paid for express shipping and the package is already {days} days late.",
        "Where is my order? I ordered the {product} on {date} and nothing has arrived.",
        "The estimated delivery date for order {order} keeps moving, it is now {days} days late.",
        "My package has been sitting at the {carrier} depot in {city} for a week.",
    ),
    "cancel_subscription": (
        "Please cancel my subscription to the {plan}, I don't want it to renew.",
        "How do I cancel my membership? I can't find the option in the app.",
        "I want to stop the auto-renewal of my {plan} before {date}.",
        "Cancel my account's subscription effective immediately, please.",
        "I'd like to end my {plan} at the end of this billing cycle.",
        "Please unsubscribe me from the {plan}, I no longer use the service.",
        "I tried to cancel my subscription on my {device} but it still shows as active.",
        "Terminate my membership and confirm by email at {email}.",
        "I signed up for the free trial of the {plan} and want to cancel before it converts.",
        "Stop my monthly subscription, I am switching to another provider.",
        "Can you downgrade me and cancel the {plan} renewal?",
        "I want to close my subscription. Please confirm the cancellation.",
    ),
    "technical_bug": (
        "The app crashes every time I open the settings page on my {device}.",
        "I get error {error} when I try to upload a file.",
        "The website shows a blank white page after I click checkout, error {error}.",
        "Since the last update the app freezes on startup on my {device}.",
        "Notifications stopped working on my {device} after the update to version {version}.",
        "The search feature returns error {error} for every query.",
        "Your app keeps crashing when I play a video, I'm on version {version}.",
        "Sync is broken: changes on my {device} don't show up on the web app.",
        "The page won't load and the console says {error}.",
        "There is a bug in the export feature, the PDF comes out empty.",
        "After installing version {version} the app won't start, it just closes.",
        "Buttons on the dashboard don't respond on my {device}, looks like a bug.",
        "Dark mode makes the text unreadable in version {version}, please fix this bug.",
    ),
    "account_update": (
        "I need to change the email address on my account to {email}.",
        "Please update my shipping address to {street}, {city}.",
        "How do I change the name on my profile? It is misspelled.",
        "I moved to {city} and need to update my address in my account settings.",
        "Can you update the phone number on my account? My new number is {phone}.",
        "I want to change the email I use to log in from my old one to {email}.",
        "Please update my billing address to {street}, {city}.",
        "My profile still shows my old last name, I'd like to update it.",
        "How can I change my username? The profile page doesn't let me edit it.",
        "Update the contact details on my account: phone {phone}, email {email}.",
        "I'd like to change the language and country settings of my account to {country}.",
        "Please change my account's default address to {street}, {city}.",
    ),
    "product_question": (
        "Does the {product} work with a {device}?",
        "What are the dimensions of the {product}? I want to know if it fits my desk.",
        "Is the {product} available in another colour?",
        "Can the {product} be used outdoors, is it waterproof?",
        "How long does the battery of the {product} last on a full charge?",
        "Is the {product} compatible with the {product2}?",
        "When will the {product} be back in stock?",
        "What is the difference between the {product} and the {product2}?",
        "Does the {product} come with a warranty, and for how long?",
        "Which size of the {product} would you recommend for a small apartment?",
        "Can I use the {product} with voltage in {country}?",
        "Is a cable included in the box with the {product}?",
        "Is there a newer model of the {product} coming out soon?",
    ),
    "complaint": (
        "Your customer service is terrible, nobody answered my last {days} emails.",
        "The agent I spoke to on {date} was rude and hung up on me.",
        "I am very disappointed with the quality of service, I expected much better.",
        "I want to file a formal complaint about how I was treated in your {city} store.",
        "This is unacceptable. I have been waiting on hold for over an hour.",
        "I'm extremely unhappy with your support team, they keep ignoring my requests.",
        "Worst customer experience I've ever had. I want to speak to a manager.",
        "Your staff promised a callback on {date} and nobody ever called. Very frustrating.",
        "I have been a loyal customer for {years} years and this treatment is disgraceful.",
        "Nobody takes responsibility at your company, I'm sent from one department to another.",
        "I'm writing to complain about the attitude of your delivery driver in {city}.",
        "Your chat agent closed my conversation without helping. Please escalate to a supervisor.",
    ),
    "order_change": (
        "Can I change the size on order {order} from medium to large before it ships?",
        "I'd like to add a second {product} to order {order}, it hasn't shipped yet.",
        "Please change the colour of the {product} in order {order} to black.",
        "I ordered the wrong item, can you swap the {product} for the {product2} in order {order}?",
        "Can I change the quantity of order {order} to {qty}?",
        "Please remove the {product} from order {order}, I only want the rest.",
        "I need to modify my order {order}: replace the {product} with the {product2}.",
        "Is it still possible to edit order {order}? I want to change the delivery date to {date}.",
        "Please update the items in my order {order}, I want {qty} of the {product} instead of one.",
        "I placed order {order} by mistake with the wrong variant, could you change it?",
        "Can you switch the gift wrap option on for order {order}?",
        "Please change the delivery address of order {order} to {street}, {city}, it has not shipped.",
    ),
    "payment_declined": (
        "My card keeps getting declined at checkout even though it has enough funds.",
        "The payment of {amount} failed with 'transaction declined', what's wrong?",
        "I can't pay for the {plan}, my credit card is rejected every time.",
        "Checkout says 'payment method not accepted' for my card. Do you take {wallet}?",
        "Why was my payment declined? My bank says there is no problem on their side.",
        "I tried three different cards and all of them were declined on your site.",
        "Payment with {wallet} fails at the last step and the order is not placed.",
        "My subscription payment was declined on {date}, how do I update the card?",
        "The card payment for order {order} did not go through, it says 'do not honor'.",
        "Paying {amount} with my debit card fails with error {error}.",
        "Your site won't accept my card, the payment gets declined instantly.",
        "The renewal payment for the {plan} failed, my card was declined.",
    ),
}

_GREETINGS = (
    "",
    "",
    "Hi,",
    "Hello,",
    "Hi there,",
    "Hey,",
    "Good morning,",
    "Good afternoon,",
    "Dear support,",
    "Hello support team,",
    "Hi team,",
    "Hey there!",
    "Hi {agent},",
    "To whom it may concern,",
    "Greetings,",
)

_REMARKS = (
    "I have been a customer for {years} years.",
    "This is the second time I'm writing about this.",
    "I already checked the help center.",
    "Sorry if this is the wrong place to ask.",
    "Please get back to me as soon as possible.",
    "I'd appreciate a quick answer.",
    "Let me know if you need more information.",
    "I'm writing from my phone, sorry for typos.",
    "My customer number is {customer}.",
    "It's quite urgent for me.",
    "I hope you can help.",
    "Thanks for looking into it.",
)

_SIGNOFFS = (
    "",
    "",
    "Thanks,",
    "Thanks!",
    "Thank you.",
    "Thanks in advance.",
    "Regards, {name}",
    "Best, {name}",
    "Cheers, {name}",
    "Kind regards,\n{name}",
    "- {name}",
)

_STUBS = (
    "help!!",
    "hi",
    "hello?",
    "???",
    "urgent",
    "refund",
    "pls help",
    "not working",
    "call me",
    "ok",
    "thanks",
    "test",
    "asap!!!",
    "any update?",
    "hello hello",
    "password",
    "cancel",
    "where is it",
    "why??",
    "..",
)

_LOG_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
_LOG_EVENTS = (
    "request to /api/v2/orders returned 502 Bad Gateway",
    "retrying connection to sync service (attempt {n})",
    "java.lang.NullPointerException at com.shop.app.Checkout.submit(Checkout.java:{n})",
    "cache miss for user session, reloading profile",
    "render of view DashboardFragment took {n} ms",
    "socket timeout after {n} ms while uploading chunk",
    "token refresh failed: 401 Unauthorized",
    "database is locked, waiting {n} ms",
)

_POOLS: dict[str, tuple[str, ...]] = {
    "product": (
        "wireless earbuds",
        "standing desk",
        "coffee grinder",
        "smart thermostat",
        "yoga mat",
        "laptop sleeve",
        "air fryer",
        "electric toothbrush",
        "hiking backpack",
        "desk lamp",
        "robot vacuum",
        "bluetooth speaker",
        "office chair",
        "water bottle",
        "phone case",
        "4K monitor",
        "mechanical keyboard",
        "baby monitor",
        "espresso machine",
        "fitness tracker",
        "rain jacket",
        "car charger",
        "kettle",
        "webcam",
        "gaming mouse",
        "smart watch",
    ),
    "plan": (
        "Premium plan",
        "Pro plan",
        "Family plan",
        "Basic plan",
        "annual plan",
        "Plus membership",
        "monthly plan",
        "Business plan",
        "student plan",
    ),
    "device": (
        "iPhone 14",
        "iPhone 15",
        "Pixel 8",
        "Galaxy S23",
        "iPad",
        "MacBook",
        "Windows laptop",
        "Android tablet",
        "Chromebook",
        "Fire TV",
    ),
    "carrier": ("UPS", "FedEx", "DHL", "USPS", "DPD", "the courier", "Royal Mail", "GLS"),
    "city": (
        "Lyon",
        "Austin",
        "Leeds",
        "Toronto",
        "Munich",
        "Porto",
        "Denver",
        "Melbourne",
        "Dublin",
        "São Paulo",
        "Kraków",
        "Osaka",
        "Seattle",
        "Milan",
    ),
    "country": ("Germany", "Canada", "Spain", "Japan", "Brazil", "the UK", "Australia", "France"),
    "wallet": ("PayPal", "Apple Pay", "Google Pay", "Klarna", "a prepaid card"),
    "name": (
        "Anna",
        "Ben",
        "Carlos",
        "Dana",
        "Elif",
        "Farah",
        "George",
        "Hana",
        "Ivan",
        "José",
        "Kim",
        "Liam",
        "Maya",
        "Noor",
        "Olivia",
        "Pierre",
        "Quinn",
        "Ravi",
        "Sofia",
        "Tom",
        "Zoë",
    ),
}
_POOLS["product2"] = _POOLS["product"]
_POOLS["agent"] = ("Sam", "Alex", "Jordan", "Chris", "Taylor", "support")


def _numeric_pools() -> dict[str, tuple[str, ...]]:
    """Pools of ids, amounts and dates, drawn once from a fixed seed so they never change."""
    rng = np.random.default_rng(20240101)
    months = (
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    )
    relative = ("yesterday", "last Monday", "last week", "two weeks ago", "last Friday", "this morning")
    first = ("j", "anna", "m.rossi", "kim", "t.nguyen", "lee", "sam", "p.dubois", "chris", "alex")
    domains = ("example.com", "mail.com", "inbox.org", "webmail.net")
    streets = ("Main Street", "Oak Avenue", "Rue de la Paix", "Baker Street", "Elm Road", "Lindenstraße")
    return {
        "order": tuple(
            f"#{c}{n}"
            for c, n in zip(
                rng.choice(list("ABCDEFGHKMNPRSTW"), 4000), rng.integers(10_000, 999_999, 4000), strict=True
            )
        ),
        "amount": tuple(
            f"{cur}{v:.2f}" if cur != "€" else f"{v:.2f} €"
            for cur, v in zip(rng.choice(["$", "$", "£", "€"], 2000), rng.uniform(3, 900, 2000), strict=True)
        ),
        "date": tuple(
            f"{m} {d}" for m, d in zip(rng.choice(months, 300), rng.integers(1, 29, 300), strict=True)
        )
        + relative,
        "days": tuple(str(d) for d in range(2, 31)),
        "years": tuple(str(y) for y in range(2, 16)),
        "qty": tuple(str(q) for q in range(2, 7)),
        "error": tuple(
            f"{p}-{n}"
            for p, n in zip(
                rng.choice(["ERR", "E", "0x", "HTTP"], 400), rng.integers(100, 999, 400), strict=True
            )
        ),
        "version": tuple(
            f"{a}.{b}.{c}"
            for a, b, c in zip(
                rng.integers(2, 9, 200), rng.integers(0, 20, 200), rng.integers(0, 9, 200), strict=True
            )
        ),
        "email": tuple(
            f"{f}{n}@{d}"
            for f, n, d in zip(
                rng.choice(first, 1000), rng.integers(1, 999, 1000), rng.choice(domains, 1000), strict=True
            )
        ),
        "phone": tuple(f"+1 555 {n // 10_000:03d} {n % 10_000:04d}" for n in rng.integers(0, 9_999_999, 500)),
        "street": tuple(
            f"{n} {s}" for n, s in zip(rng.integers(1, 250, 500), rng.choice(streets, 500), strict=True)
        ),
        "customer": tuple(f"C-{n}" for n in rng.integers(100_000, 999_999, 1000)),
    }


_POOLS.update(_numeric_pools())


def _fields(template: str) -> tuple[str, ...]:
    return tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)


_CORE_FIELDS = {intent: tuple(_fields(t) for t in ts) for intent, ts in _CORE.items()}
for _intent in INTENTS:  # every intent needs sentences, and every slot a pool
    assert _intent in _CORE, _intent
    assert all(f in _POOLS for fs in _CORE_FIELDS[_intent] for f in fs)


class _Slots:
    """Per-row slot values drawn lazily from pre-drawn index arrays (one numpy call per slot)."""

    def __init__(self, rng: np.random.Generator, n: int):
        self._idx = {name: rng.integers(0, len(pool), n).tolist() for name, pool in sorted(_POOLS.items())}

    def fill(self, template: str, fields: tuple[str, ...], row: int) -> str:
        if not fields:
            return template
        return template.format(**{f: _POOLS[f][self._idx[f][row]] for f in fields})


def _compose(rng: np.random.Generator, intents: np.ndarray) -> list[str]:
    """Clean messages for the given intent indices: the same number of draws whatever the content."""
    n = len(intents)
    slots = _Slots(rng, n)
    core_pick = rng.random((n, 2))
    second_core = rng.random(n) < 0.35
    greeting = rng.integers(0, len(_GREETINGS), n).tolist()
    remark = np.where(rng.random(n) < 0.4, rng.integers(0, len(_REMARKS), n), -1).tolist()
    signoff = rng.integers(0, len(_SIGNOFFS), n).tolist()
    style = rng.random(n)  # < 0.12 all lower case, < 0.16 one line per sentence
    greeting_fields = [_fields(g) for g in _GREETINGS]
    remark_fields = [_fields(r) for r in _REMARKS]
    signoff_fields = [_fields(s) for s in _SIGNOFFS]

    out: list[str] = []
    for i, intent_idx in enumerate(intents.tolist()):
        templates = _CORE[INTENTS[intent_idx]]
        fields = _CORE_FIELDS[INTENTS[intent_idx]]
        first = int(core_pick[i, 0] * len(templates))
        parts = [slots.fill(_GREETINGS[greeting[i]], greeting_fields[greeting[i]], i)]
        parts.append(slots.fill(templates[first], fields[first], i))
        if second_core[i]:
            # a different sentence of the same intent, so the message never repeats itself
            second = (first + 1 + int(core_pick[i, 1] * (len(templates) - 1))) % len(templates)
            parts.append(slots.fill(templates[second], fields[second], i))
        if remark[i] >= 0:
            parts.append(slots.fill(_REMARKS[remark[i]], remark_fields[remark[i]], i))
        parts.append(slots.fill(_SIGNOFFS[signoff[i]], signoff_fields[signoff[i]], i))
        sep = "\n" if 0.12 <= style[i] < 0.16 else " "
        text = sep.join(p for p in parts[1:] if p)
        if parts[0]:
            # a greeting ending in a comma opens a letter: the message starts on the next line
            text = parts[0] + ("\n" if parts[0].endswith(",") else " ") + text
        out.append(text.lower() if style[i] < 0.12 else text)
    return out


def _pasted_log(rng: np.random.Generator, message: str) -> str:
    """The message followed by a log long enough to exceed 2,048 characters."""
    n_lines = int(rng.integers(30, 70))
    levels = rng.integers(0, len(_LOG_LEVELS), n_lines)
    events = rng.integers(0, len(_LOG_EVENTS), n_lines)
    numbers = rng.integers(1, 5000, n_lines)
    seconds = np.sort(rng.integers(0, 86_400, n_lines))
    lines = [
        f"2024-05-{1 + s // 3600 % 28:02d} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d} "
        f"{_LOG_LEVELS[lv]:<5} [main] {_LOG_EVENTS[ev].format(n=num)}"
        for s, lv, ev, num in zip(
            seconds.tolist(), levels.tolist(), events.tolist(), numbers.tolist(), strict=True
        )
    ]
    return message + "\nHere is what the app printed:\n" + "\n".join(lines)


def _block(seed: int, block: int) -> dict[str, list]:
    """One block of ``_BLOCK_ROWS`` rows, seeded by (seed, block): the unit of determinism."""
    rng = np.random.default_rng([seed, _TICKET_STREAM, block])
    n = _BLOCK_ROWS
    intents = rng.integers(0, len(INTENTS), n)
    messages = _compose(rng, intents)

    kind = rng.random(n)
    stub_pick = rng.integers(0, len(_STUBS), n)
    stub_pad = rng.random(n)
    for i in np.flatnonzero(kind < STUB_RATE).tolist():
        stub = _STUBS[stub_pick[i]]
        # some stubs arrive padded with whitespace: only a trimmed length check catches them
        messages[i] = f"   {stub}{' ' * 20}\n" if stub_pad[i] < 0.25 else stub
    for i in np.flatnonzero((kind >= STUB_RATE) & (kind < STUB_RATE + LONG_RATE)).tolist():
        messages[i] = _pasted_log(rng, messages[i])

    labels: list[str | None] = [INTENTS[k] for k in intents.tolist()]
    low_quality = rng.random(n) < LOW_QUALITY_RATE
    wrong_label = low_quality & (rng.random(n) < LOW_QUALITY_WRONG_LABEL_RATE)
    # a wrong label is any other intent: shift by 1..len-1 positions
    wrong_shift = rng.integers(1, len(INTENTS), n)
    for i in np.flatnonzero(wrong_label).tolist():
        labels[i] = INTENTS[(intents[i] + wrong_shift[i]) % len(INTENTS)]
    for i in np.flatnonzero(rng.random(n) < NULL_LABEL_RATE).tolist():
        labels[i] = None

    # floor, not round, keeps low scores strictly below the threshold
    low = np.floor(rng.uniform(0.05, MIN_GOOD_QUALITY, n) * 1000) / 1000
    good = np.round(rng.uniform(MIN_GOOD_QUALITY, 1.0, n), 3)
    quality = np.where(low_quality, low, good)
    days = rng.integers(0, _DATE_SPAN_DAYS, n)

    # a duplicate re-sends an earlier row of the block, a few days later at most
    duplicate = rng.random(n) < DUPLICATE_RATE
    duplicate[0] = False
    source = (rng.random(n) * np.arange(n)).astype(np.int64)
    resend_delay = rng.integers(0, 3, n)
    for i in np.flatnonzero(duplicate).tolist():
        j = int(source[i])  # j < i, so a chain of re-sends is already resolved
        messages[i], labels[i], quality[i] = messages[j], labels[j], quality[j]
        days[i] = days[j] + resend_delay[i]

    dates = np.datetime_as_string(_FIRST_DATE + days.astype("timedelta64[D]"), unit="D").tolist()
    hashes = [hashlib.sha256(m.encode("utf-8")).hexdigest() for m in messages]
    return {
        "message": messages,
        "intent_label": labels,
        "quality_score": quality.tolist(),
        "message_hash": hashes,
        "created_date": dates,
    }


def generate_support_tickets(n_rows: int, seed: int = 7, *, start_row: int = 0) -> pa.Table:
    """Rows ``start_row .. start_row + n_rows - 1`` of the support-ticket stream for ``seed``.

    A row depends only on (seed, row number), so chunks generated separately concatenate to
    exactly the table generated at once. Keep ``n_rows`` to what fits in memory (a few hundred
    thousand rows per call); :func:`write_demo_dataset` writes any size chunk by chunk.
    """
    if n_rows < 0 or start_row < 0:
        raise ValueError(f"n_rows ({n_rows}) and start_row ({start_row}) must be >= 0")
    if n_rows == 0:
        return SCHEMA.empty_table()
    first_block, last_block = start_row // _BLOCK_ROWS, (start_row + n_rows - 1) // _BLOCK_ROWS
    tables = [
        pa.Table.from_pydict(_block(seed, b), schema=SCHEMA) for b in range(first_block, last_block + 1)
    ]
    table = pa.concat_tables(tables)
    return table.slice(start_row - first_block * _BLOCK_ROWS, n_rows).combine_chunks()


def demo_corpus(n_texts: int, seed: int) -> list[str]:
    """Clean messages (no stubs, logs, duplicates or labels) to train a tokenizer or a base model on."""
    texts: list[str] = []
    block = 0
    while len(texts) < n_texts:
        rng = np.random.default_rng([seed, _CORPUS_STREAM, block])
        texts.extend(_compose(rng, rng.integers(0, len(INTENTS), _BLOCK_ROWS)))
        block += 1
    return texts[:n_texts]


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

_HELPDESK_CORE_FIELDS = {c: tuple(_fields(t) for t in ts) for c, ts in _HELPDESK_CORE.items()}
assert set(_HELPDESK_CORE) == set(HELPDESK_CATEGORIES)
assert all(
    f in _POOLS
    for ts in (*_HELPDESK_CORE.values(), _HELPDESK_CONTEXT, _HELPDESK_OPENINGS, _HELPDESK_CLOSINGS)
    for t in ts
    for f in _fields(t)
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


def _helpdesk_text(rng: np.random.Generator, category: str, slots: tuple[_Slots, _Slots], row: int) -> str:
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
        sentence = other.fill(_HELPDESK_CONTEXT[c], _fields(_HELPDESK_CONTEXT[c]), row)
        # context opens the ticket more often than it follows the problem
        sentences.insert(0 if rng.random() < 0.6 else len(sentences), sentence)
    paragraph_style = rng.random() < 0.2
    body = ("\n" if paragraph_style else " ").join(sentences)
    opening = _HELPDESK_OPENINGS[int(rng.integers(len(_HELPDESK_OPENINGS)))]
    closing = _HELPDESK_CLOSINGS[int(rng.integers(len(_HELPDESK_CLOSINGS)))]
    if opening:
        body = other.fill(opening, _fields(opening), row) + ("\n\n" if rng.random() < 0.5 else " ") + body
    if closing:
        body += "\n\n" + other.fill(closing, _fields(closing), row)
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
    slots = (_Slots(rng, n_rows), _Slots(rng, n_rows))
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
    from sparktune.config import settings

    parser = argparse.ArgumentParser(
        prog="python -m sparktune.demo_data",
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
