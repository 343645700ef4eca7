"""JVM options for the driver of a short Spark job.

A pipeline's Spark tasks (prepare, quality gate, materialize, batch scoring) start a driver JVM
each. On small inputs most of that JVM's CPU goes to the C2 just-in-time compiler and the parallel
collector's threads warming up for work that ends seconds later: the C1 compiler alone and the
serial collector (``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``) cut the CPU of a 500-row
``prepare_data`` job by about 40 % on 2 cores, and still by about 25 % on a 70 MB source, with the
same output. A long job on a large input wants C2's faster code, so the options apply only when the
input is known to be small: files (local or any fsspec URI) adding up to at most
``SHORT_JOB_MAX_BYTES``. A catalog table, or a location whose size cannot be read, keeps the JVM's
defaults. A value the user sets for ``spark.driver.extraJavaOptions`` always wins.

In ``local`` mode the driver JVM runs the executors too; on a cluster only the driver (client mode)
takes these options, and executors keep theirs.

Every driver also maps a class data sharing archive of Spark's classes when this environment has
one (``build_class_archive``, run by ``make venv``): a cold driver then skips loading and verifying
some 13,000 of the 17,000 classes a small job loads, about a third of a short job's JVM start
(docs/decisions/0008-spark-class-data-sharing.md). An archive that does not fit the JVM (another
Java build, another classpath) is ignored by the JVM.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
SHORT_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SHORT_JOB_MAX_BYTES = 256 * 1024 * 1024
# A path for the archive, or "off" for none; default: the user's cache (class_archive_path).
CLASS_ARCHIVE_ENV = "SPARKTUNE_SPARK_CLASS_ARCHIVE"


def input_bytes(uri: str | None, storage_options: Mapping[str, Any] | None = None) -> int | None:
    """Total bytes of the files at ``uri`` (a file, a folder, or a glob), or None when unknown: an
    empty value, a catalog table, a location that does not exist or cannot be listed (the caller
    then keeps the JVM's defaults)."""
    from sparktune.data.fingerprint import list_source_files

    listed = list_source_files(uri, dict(storage_options or {}))
    return None if listed is None else listed.size


def _java_binary() -> Path | None:
    """The ``java`` that spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def class_archive_path() -> Path | None:
    """Where this environment's archive belongs; None when archives are off or there is no Java.

    ``SPARKTUNE_SPARK_CLASS_ARCHIVE`` when set (``off``: none); else the user's cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``), named after the Spark install (:func:`spark_install_identity`)
    and the Java runtime, so that another venv, a venv reinstalled in the same place or an upgraded
    JDK gets an archive of its own.
    """
    explicit = os.environ.get(CLASS_ARCHIVE_ENV, "").strip()
    if explicit.lower() == "off":
        return None
    if explicit:
        return Path(explicit).expanduser()
    java = _java_binary()
    spec = importlib.util.find_spec("pyspark")  # not imported: operators call this before any Spark
    if java is None or spec is None or spec.origin is None:
        return None
    version = metadata.version("pyspark")
    spark_home = Path(spec.origin).resolve().parent
    identity = f"{spark_install_identity(spark_home, version)}|{java}|{java.stat().st_mtime_ns}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sparktune" / "spark-classes" / f"spark-{version}-{key}.jsa"


def spark_install_identity(spark_home: Path, version: str) -> str:
    """Spark's folder, version, and every jar's name, size and modification time.

    The JVM maps an archive only while each jar on the classpath has the size and modification time
    it had when the archive was built. A venv deleted and installed again at the same path has the
    same folder and version but new jar times: keyed on those two alone, it found the old archive
    "already built", and every driver silently loaded its classes from the jars again.
    """
    stamps = ",".join(
        f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}"
        for jar in sorted((spark_home / "jars").glob("*.jar"))
        for stat in (jar.stat(),)
    )
    return f"{spark_home}|{version}|{stamps}"


def class_archive() -> Path | None:
    """This environment's archive when it has been built, else None."""
    path = class_archive_path()
    return path if path is not None and path.is_file() else None


def build_class_archive(path: Path | None = None, *, force: bool = False, timeout: float = 900) -> Path:
    """Record the classes a short job loads (``sparktune.jobs.class_archive_workload`` under
    spark-submit, ``local[2]``) into an archive at ``path`` (default: ``class_archive_path()``).

    About a minute of CPU, once per environment; an existing archive is kept unless ``force``.
    The JVM writes the archive at exit: it is written beside ``path`` and renamed into place, under
    a file lock, so that concurrent builders and readers never see half an archive.
    """
    from filelock import FileLock

    target = path or class_archive_path()
    if target is None:
        raise RuntimeError(
            f"no class archive to build: {CLASS_ARCHIVE_ENV}=off, or no Java found (set JAVA_HOME "
            "or put java on PATH; Spark needs Java 17 or newer)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file() and not force:
            return target
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        workload = Path(__file__).resolve().parents[1] / "jobs" / "class_archive_workload.py"
        spark_submit = Path(sys.executable).parent / "spark-submit"
        command = [
            str(spark_submit) if spark_submit.exists() else "spark-submit",
            *("--master", "local[2]", "--conf", "spark.log.level=WARN"),
            *("--conf", f"{DRIVER_JAVA_OPTIONS}={SHORT_JOB_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}"),
            str(workload),
        ]
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise RuntimeError(
                f"building the Spark class archive failed (exit {result.returncode}); Spark jobs run "
                f"without it. Output:\n{(result.stdout + result.stderr)[-4000:]}"
            )
        partial.replace(target)
    return target


def short_job_conf(conf: Mapping[str, Any] | None, size: int | None) -> dict[str, Any]:
    """``conf`` plus the driver's JVM options, unless ``conf`` sets ``spark.driver.extraJavaOptions``
    itself: the short-job options when ``size`` is known and small, and the class archive when this
    environment has one."""
    result = dict(conf or {})
    if DRIVER_JAVA_OPTIONS in result:
        return result
    options = []
    if size is not None and size <= SHORT_JOB_MAX_BYTES:
        options.append(SHORT_JOB_JAVA_OPTIONS)
    archive = class_archive()
    if archive is not None:
        options.append(f"-XX:SharedArchiveFile={archive}")
    if options:
        result[DRIVER_JAVA_OPTIONS] = " ".join(options)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.data.spark_jvm", description="Build the Spark class data sharing archive."
    )
    parser.add_argument("command", choices=["build-class-archive", "class-archive-path"])
    parser.add_argument("--force", action="store_true", help="rebuild an archive that exists")
    args = parser.parse_args(argv)
    if args.command == "class-archive-path":
        print(class_archive_path() or "off")
        return 0
    path = class_archive_path()
    if path is None:
        print(f"Spark class archive: off ({CLASS_ARCHIVE_ENV}=off or no Java)")
        return 0
    existed = path.is_file() and not args.force
    build_class_archive(path, force=args.force)
    print(f"Spark class archive: {path}{' (already built)' if existed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
