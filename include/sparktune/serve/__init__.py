"""Online serving: the champion over HTTP, in MLflow's scoring protocol, every answer captured.

``python -m sparktune.serve`` (``make serve``) starts a FastAPI app under uvicorn on
127.0.0.1:5001 that answers ``POST /invocations`` with ``models:/<model_name>@champion``. The parts,
one module each, usable without the server:

- :mod:`.settings`: flags, ``SPARKTUNE_SERVING_*`` variables and their defaults;
- :mod:`.protocol`: MLflow's request formats read into texts, and every 4xx a client can get;
- :mod:`.champion`: the served version, followed through the alias and swapped without a failed request;
- :mod:`.batching`: concurrent requests grouped into one predict call on a worker thread;
- :mod:`.capture`: answered requests appended to ``<lake>/serving_captures`` (Parquet by date);
- :mod:`.app`: the endpoints that tie them together.

See docs/decisions/0006-serving.md for why this server exists beside ``mlflow models serve``.
"""
