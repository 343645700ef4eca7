"""Support-ticket messages for the built-in base model and the demo data (long: mostly phrase tables).

The built-in base model (:mod:`sparktune.model.base_model`) trains its tokenizer and pretrains on
:func:`demo_corpus`; :func:`generate_support_tickets` is the seed use case and the benchmark data,
which ``python -m sparktune_dev.demo_data`` writes to files. Both compose their messages from the
same tables, so the base model knows the words of the data it is fine-tuned on.

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

import hashlib
import string

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
BLOCK_ROWS = 4096
_FIRST_DATE = np.datetime64("2024-01-01")
_DATE_SPAN_DAYS = 731
# Separate random streams, so the corpus and the tickets never share draws (3 is the helpdesk
# export's, in sparktune_dev.demo_data).
_TICKET_STREAM = 1
_CORPUS_STREAM = 2

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

SLOT_POOLS: dict[str, tuple[str, ...]] = {
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
SLOT_POOLS["product2"] = SLOT_POOLS["product"]
SLOT_POOLS["agent"] = ("Sam", "Alex", "Jordan", "Chris", "Taylor", "support")


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


SLOT_POOLS.update(_numeric_pools())


def template_fields(template: str) -> tuple[str, ...]:
    """The slot names of ``template`` (``{order}``, ``{product}``...), in order, repeats kept."""
    return tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)


_CORE_FIELDS = {intent: tuple(template_fields(t) for t in ts) for intent, ts in _CORE.items()}
for _intent in INTENTS:  # every intent needs sentences, and every slot a pool
    assert _intent in _CORE, _intent
    assert all(f in SLOT_POOLS for fs in _CORE_FIELDS[_intent] for f in fs)


class Slots:
    """Per-row slot values drawn lazily from pre-drawn index arrays (one numpy call per slot).

    Every pool of :data:`SLOT_POOLS` is drawn for ``n`` rows, used or not, so the draws that follow
    do not depend on which templates the rows pick."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self._idx = {
            name: rng.integers(0, len(pool), n).tolist() for name, pool in sorted(SLOT_POOLS.items())
        }

    def fill(self, template: str, fields: tuple[str, ...], row: int) -> str:
        """``template`` with its ``fields`` (:func:`template_fields`) filled with row ``row``'s values."""
        if not fields:
            return template
        return template.format(**{f: SLOT_POOLS[f][self._idx[f][row]] for f in fields})


def _compose(rng: np.random.Generator, intents: np.ndarray) -> list[str]:
    """Clean messages for the given intent indices: the same number of draws whatever the content."""
    n = len(intents)
    slots = Slots(rng, n)
    core_pick = rng.random((n, 2))
    second_core = rng.random(n) < 0.35
    greeting = rng.integers(0, len(_GREETINGS), n).tolist()
    remark = np.where(rng.random(n) < 0.4, rng.integers(0, len(_REMARKS), n), -1).tolist()
    signoff = rng.integers(0, len(_SIGNOFFS), n).tolist()
    style = rng.random(n)  # < 0.12 all lower case, < 0.16 one line per sentence
    greeting_fields = [template_fields(g) for g in _GREETINGS]
    remark_fields = [template_fields(r) for r in _REMARKS]
    signoff_fields = [template_fields(s) for s in _SIGNOFFS]

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
    """One block of ``BLOCK_ROWS`` rows, seeded by (seed, block): the unit of determinism."""
    rng = np.random.default_rng([seed, _TICKET_STREAM, block])
    n = BLOCK_ROWS
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
    thousand rows per call); ``sparktune_dev.demo_data.write_demo_dataset`` writes any size chunk by
    chunk.
    """
    if n_rows < 0 or start_row < 0:
        raise ValueError(f"n_rows ({n_rows}) and start_row ({start_row}) must be >= 0")
    if n_rows == 0:
        return SCHEMA.empty_table()
    first_block, last_block = start_row // BLOCK_ROWS, (start_row + n_rows - 1) // BLOCK_ROWS
    tables = [
        pa.Table.from_pydict(_block(seed, b), schema=SCHEMA) for b in range(first_block, last_block + 1)
    ]
    table = pa.concat_tables(tables)
    return table.slice(start_row - first_block * BLOCK_ROWS, n_rows).combine_chunks()


def demo_corpus(n_texts: int, seed: int) -> list[str]:
    """Clean messages (no stubs, logs, duplicates or labels) to train a tokenizer or a base model on."""
    texts: list[str] = []
    block = 0
    while len(texts) < n_texts:
        rng = np.random.default_rng([seed, _CORPUS_STREAM, block])
        texts.extend(_compose(rng, rng.integers(0, len(INTENTS), BLOCK_ROWS)))
        block += 1
    return texts[:n_texts]
