"""spark-submit application run once to record which classes a short sparktune job loads.

    spark-submit --conf spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit=spark.jsa \\
        include/sparktune/jobs/class_archive_workload.py

``sparktune.data.spark_jvm.build_class_archive`` runs it; the JVM writes the classes it loaded into a
class data sharing archive at exit, which later drivers map instead of loading and verifying the
same classes again (docs/decisions/0008-spark-class-data-sharing.md). It exercises what the
pipeline's jobs do on small inputs, on data of its own: JSON and CSV read with schema inference,
filters, window functions and aggregations, a pandas UDF and ``mapInArrow`` (Python workers over
Arrow), partitioned Parquet written and read back. A class it misses is loaded as usual.
"""

# No `from __future__ import annotations`: pandas_udf reads n_words' type hints at definition.
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def run(spark: Any, folder: Path) -> int:
    """The workload on ``folder``; returns the train rows read back."""
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    source = folder / "rows.jsonl"
    labels = ("billing", "shipping", "refund")
    source.write_text(
        "".join(
            json.dumps({"message": f"message {i} " * (i % 7 + 1), "label": labels[i % 3], "score": i / 100})
            + "\n"
            for i in range(300)
        )
    )
    df = spark.read.json(str(source))
    csv_rows = "".join(f"text {i},{labels[i % 3]}\n" for i in range(50))
    (folder / "rows.csv").write_text("message,label\n" + csv_rows)
    csv = spark.read.option("header", True).option("inferSchema", True).csv(str(folder / "rows.csv"))

    @F.pandas_udf("int")
    def n_words(texts: pd.Series) -> pd.Series:
        return texts.str.split().str.len()

    def arrow_lengths(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.compute.utf8_length(batch.column("message"))})

    window = Window.partitionBy("label").orderBy(F.col("score").desc())
    prepared = (
        df.unionByName(csv, allowMissingColumns=True)
        .filter(F.col("message").isNotNull() & (F.length("message") > 3))
        .withColumn("words", n_words("message"))
        .withColumn("key", F.sha2(F.lower(F.trim("message")), 256))
        .withColumn("rank", F.row_number().over(window))
        .dropDuplicates(["key"])
        .withColumn("split", F.when(F.abs(F.hash("key")) % 10 < 8, "train").otherwise("test"))
    ).persist()
    prepared.groupBy("label", "split").agg(F.count("*"), F.avg("words"), F.max("rank")).collect()
    prepared.agg(*(F.sum(F.col(c).isNull().cast("int")) for c in prepared.columns)).collect()
    prepared.select(F.approx_count_distinct("label"), F.stddev("score")).collect()
    prepared.mapInArrow(arrow_lengths, "n int").agg(F.sum("n")).collect()
    out = str(folder / "prepared")
    prepared.orderBy("split", "key").write.mode("error").partitionBy("split").parquet(out)
    prepared.unpersist()
    return spark.read.parquet(out).filter(F.col("split") == "train").count()


def main() -> int:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("sparktune-class-archive").getOrCreate()
    try:
        with tempfile.TemporaryDirectory(prefix="sparktune-class-archive-") as folder:
            rows = run(spark, Path(folder))
    finally:
        spark.stop()
    print(f"class archive workload: {rows} rows read back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
