# The production image: the official Airflow image plus Java (Spark) and this project.
# First version; the production-stack issue completes it (see docker-compose.yaml).
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

USER airflow
COPY --chown=airflow:root requirements.lock pyproject.toml /opt/sparktune/
# torch's "+cpu" build lives on the PyTorch index, not on PyPI.
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        -r /opt/sparktune/requirements.lock
COPY --chown=airflow:root include /opt/sparktune/include
COPY --chown=airflow:root operators /opt/sparktune/operators
RUN pip install --no-cache-dir --no-deps /opt/sparktune
COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins

ENV PYSPARK_PYTHON=/home/airflow/.local/bin/python \
    TOKENIZERS_PARALLELISM=false \
    SPARKTUNE_HOME=/opt/airflow/sparktune
