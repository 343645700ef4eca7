"""The stable 80/10/10 split of the prepared rows into train, validation and test.

A row's split is a function of ``(split_seed, example_id)`` only, so adding rows to the source
never moves an existing row between splits; :func:`split_fixups` is the one documented exception,
for labels too small for hashing alone to give them a validation and a test row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
TRAIN_FRACTION = 0.8
VALIDATION_FRACTION = 0.1
# A label with at least this many kept rows is guaranteed one validation and one test row.
MIN_ROWS_FOR_FULL_SPLIT = 10


def split_bucket(seed: int, example_id: Column) -> Column:
    """A uniform number in [0, 1) from sha256(seed:example_id): stable across runs and engines."""
    from pyspark.sql import functions as F

    digest = F.sha2(F.concat(F.lit(f"{seed}:"), example_id), 256)
    return F.conv(F.substring(digest, 1, 13), 16, 10).cast("double") / float(16**13)


def base_split(bucket: Column) -> Column:
    """The split of a row by its :func:`split_bucket` alone: train, validation or test, 80/10/10."""
    from pyspark.sql import functions as F

    return (
        F.when(bucket < TRAIN_FRACTION, "train")
        .when(bucket < TRAIN_FRACTION + VALIDATION_FRACTION, "validation")
        .otherwise("test")
    )


def split_fixups(kept: DataFrame, per_label: dict[str, dict[str, int]]) -> tuple[list[str], list[str]]:
    """Rows moved out of train so that every label with >= 10 rows has a validation and a test row.

    Hashing alone leaves a 10-row label without a test row about a third of the time. For such a
    label the train row(s) closest to the validation boundary (highest bucket) move: the highest
    to test if test is empty, the next to validation if validation is empty. This is the one
    exception to split stability: once new rows give the label a test (validation) row of its
    own, the moved row goes back to train. It touches at most two rows per small label.
    ``kept`` carries each row's ``_bucket`` (:func:`split_bucket`) and ``_base_split``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    needy = {
        label: counts
        for label, counts in per_label.items()
        if sum(counts.values()) >= MIN_ROWS_FOR_FULL_SPLIT
        and (counts["validation"] == 0 or counts["test"] == 0)
    }
    if not needy:
        return [], []
    closest = Window.partitionBy("label").orderBy(F.col("_bucket").desc(), F.col("example_id"))
    candidates = (
        kept.filter(F.col("label").isin(list(needy)) & (F.col("_base_split") == "train"))
        .select("label", "example_id", F.row_number().over(closest).alias("rank"))
        .filter(F.col("rank") <= 2)
        .collect()
    )
    by_label: dict[str, list[str]] = {}
    for row in sorted(candidates, key=lambda r: (r["label"], r["rank"])):
        by_label.setdefault(row["label"], []).append(row["example_id"])
    to_test: list[str] = []
    to_validation: list[str] = []
    for label, counts in needy.items():
        ids = by_label.get(label, [])
        if counts["test"] == 0 and ids:
            to_test.append(ids.pop(0))
        if counts["validation"] == 0 and ids:
            to_validation.append(ids.pop(0))
    log.info(
        "split: moved %d row(s) to test and %d to validation for small labels",
        len(to_test),
        len(to_validation),
    )
    return to_test, to_validation
